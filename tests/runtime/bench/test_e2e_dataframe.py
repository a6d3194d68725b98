"""The DataFrame e2e benchmark at a tiny size: five variants measured (the columnar ingest and the Python-source
reference too), ratios per round."""

from __future__ import annotations

from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.store.connection import client_for
from runtime.bench.e2e_dataframe import bench_e2e_dataframe, run_dataframe
from runtime.driver.query_stop import stop_query
from tests.waiting import wait_until

pytestmark = pytest.mark.spark


def test_five_variants_side_by_side(spark: Any, redis_server_url: str) -> None:
    cfg = FTConfig(redis_url=redis_server_url, max_pending=50_000, timeout_s=120.0)
    got = bench_e2e_dataframe(spark, cfg, 3000, 1)
    assert set(got["records_per_s"]) == {"ft-on", "ft-on-columnar", "ft-off", "plain", "python-source"}
    for variant in got["records_per_s"].values():
        assert variant["median"] > 0
    for ratio in ("ft_on_vs_plain_ratio", "ft_on_columnar_vs_plain_ratio", "ft_on_vs_off_ratio",
                  "python_source_vs_plain_ratio", "ft_on_vs_python_source_ratio"):
        assert got[ratio]["median"] > 0, ratio
    # the machine's CPU per record beside each rate (Linux: /proc/stat)
    assert set(got["cpu_us_per_record"]) == set(got["records_per_s"])
    assert all(v["min"] > 0 for v in got["cpu_us_per_record"].values())


def test_the_python_source_reference_yields_the_rows_of_the_other_variants(spark: Any) -> None:
    """The same i, user and page columns as make_value (so its pipeline filters and shuffles the same rows)."""
    from runtime.bench.e2e import make_value
    from runtime.bench.python_source import NAME, register

    register(spark)
    seen: list[Any] = []
    query = (spark.readStream.format(NAME).option("records", "120001").load().writeStream
             .foreachBatch(lambda df, _b: seen.extend(df.collect())).trigger(processingTime="100 milliseconds").start())
    try:
        wait_until(lambda: len(seen) >= 120001, 120, "every row")
    finally:
        stop_query(query, 10.0)
    rows = sorted((r["i"], r["user"], r["page"]) for r in seen)
    assert len(rows) == 120001
    assert rows == [(i, make_value(i, 0)["user"], make_value(i, 0)["page"]) for i in range(120001)]


@pytest.mark.parametrize("columnar", [False, True])
def test_ft_on_run_acks_every_record_and_leaves_no_keys(spark: Any, redis_server_url: str, columnar: bool) -> None:
    cfg = FTConfig(redis_url=redis_server_url, max_pending=50_000, timeout_s=120.0)
    run = run_dataframe(spark, cfg, 2000, ft_on=True, columnar=columnar)
    assert run.records == 2000 and run.rate > 0
    assert run.variant == ("ft-on-columnar" if columnar else "ft-on")
    assert not list(client_for(redis_server_url).scan_iter(match="benchdf*", count=1000))

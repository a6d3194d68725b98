"""The DataFrame e2e benchmark at a tiny size: three variants measured, ratios per round."""

from __future__ import annotations

from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.store.connection import client_for
from runtime.bench.e2e_dataframe import bench_e2e_dataframe, run_dataframe

pytestmark = pytest.mark.spark


def test_three_variants_side_by_side(spark: Any, redis_server_url: str) -> None:
    cfg = FTConfig(redis_url=redis_server_url, max_pending=50_000, timeout_s=120.0)
    got = bench_e2e_dataframe(spark, cfg, 3000, 1)
    assert set(got["records_per_s"]) == {"ft-on", "ft-off", "plain"}
    for variant in got["records_per_s"].values():
        assert variant["median"] > 0
    assert got["ft_on_vs_plain_ratio"]["median"] > 0 and got["ft_on_vs_off_ratio"]["median"] > 0


def test_ft_on_run_acks_every_record_and_leaves_no_keys(spark: Any, redis_server_url: str) -> None:
    cfg = FTConfig(redis_url=redis_server_url, max_pending=50_000, timeout_s=120.0)
    run = run_dataframe(spark, cfg, 2000, ft_on=True)
    assert run.records == 2000 and run.rate > 0
    assert not list(client_for(redis_server_url).scan_iter(match="benchdf*", count=1000))

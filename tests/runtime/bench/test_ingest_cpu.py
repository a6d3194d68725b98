"""The ingest CPU benchmark: a real Ingestor into a real Redis, the driver's CPU per record persisted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from runtime.bench.ingest_cpu import SOURCES, bench_ingest_cpu, one_round
from runtime.cli.bench import main


def test_every_source_reports_a_sane_spread_and_leaves_nothing(redis_server_url: str) -> None:
    res = bench_ingest_cpu(redis_server_url, records=20_000, repeats=2)
    per = res["us_per_record"]
    assert set(per) == set(SOURCES)
    for source in SOURCES:
        spread = per[source]
        # real work per record (packing, hashing, frames, the persist calls): well above 0.1 µs on any
        # machine, and far below a millisecond (a figure per batch instead of per record would show here)
        assert 0.1 < spread["min"] <= spread["median"] <= spread["max"] < 1000, (source, spread)
    client = redis.Redis.from_url(redis_server_url)
    try:
        assert list(client.scan_iter(match="benchingest*", count=1000)) == []
    finally:
        client.close()


def test_a_round_counts_only_records_persisted(redis_server_url: str) -> None:
    with pytest.raises(ValueError, match="unknown ingest source"):
        one_round(redis_server_url, 10, "socket")
    assert one_round(redis_server_url, 3000, "poll") > 0


def test_the_bench_command_writes_the_key(redis_server_url: str, tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"redis_cpu_us_per_record": 2.07}))
    code = main(["ingest-cpu", "--redis-url", redis_server_url, "--records", "5000", "--repeats", "1",
                 "--out", str(tmp_path)])
    assert code == 0
    got = json.loads((tmp_path / "results.json").read_text())
    assert got["redis_cpu_us_per_record"] == 2.07  # the other keys are kept
    assert got["ingest_us_per_record"] == round(got["ingest_cpu"]["us_per_record"]["iterable"]["median"], 2)
    assert got["ingest_us_per_record"] > 0

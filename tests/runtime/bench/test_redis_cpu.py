"""The Redis CPU benchmark: a record's life phase by phase, the server's own CPU per record."""

from __future__ import annotations

import redis

from runtime.bench.redis_cpu import PHASES, bench_redis_cpu, server_cpu_s


def test_server_cpu_grows_with_work(redis_client: redis.Redis) -> None:
    before = server_cpu_s(redis_client)
    for i in range(2000):
        redis_client.set(f"cpu-bench-probe-{i % 7}", "x" * 100)
    assert server_cpu_s(redis_client) > before


def test_redis_cpu_reports_every_phase_and_leaves_nothing(redis_server_url: str) -> None:
    res = bench_redis_cpu(redis_server_url, records=20_000, repeats=2)
    per = res["us_per_record"]
    assert set(per) == {*PHASES, "total"}
    for phase in ("persist", "read", "ack"):  # each does real per-record work on the server
        assert per[phase]["min"] > 0, phase
    assert per["total"]["min"] >= per["persist"]["min"] + per["ack"]["min"]
    client = redis.Redis.from_url(redis_server_url)
    try:
        assert list(client.scan_iter(match="benchcpu*", count=1000)) == []
    finally:
        client.close()

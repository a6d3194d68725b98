"""The complete-latency benchmark: its parts on real Redis, one short run on real Spark.

No assertion on the size of a latency (timed assertions flake): the tests check
that every record is measured exactly where it should be, that lost records and
failed runs raise instead of reporting, and that no key is left behind.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from runtime.bench.latency import (
    SETTLE_ROUNDS,
    Collector,
    LatencyBenchError,
    LatencySink,
    PacedSource,
    bench_latency,
    percentile,
    summarize,
)
from runtime.bench.latency_plain import plain_latency
from runtime.sinks import SinkContext


def _drive(source: PacedSource) -> list[dict[str, Any]]:
    """Poll a source to its end the way the ingestor does; everything it emitted, in order."""
    out: list[dict[str, Any]] = []
    source.open()
    while True:
        got = source.poll()
        if got is None:
            return out
        out.extend(got)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0


def test_paced_source_warms_up_until_ready_then_emits_exactly_the_measured_range() -> None:
    source = PacedSource(rate_per_s=5000, warmup_s=0.0, measured=300)
    source.open()
    warm: list[dict[str, Any]] = []
    while len(warm) < 50:  # not ready: it keeps warming up, however long it runs
        got = source.poll()
        assert got is not None
        warm.extend(got)
    assert source.measure_from is None
    source.mark_ready()
    rest: list[dict[str, Any]] = []
    while (got := source.poll()) is not None:
        rest.extend(got)
    values = warm + rest
    assert [v["i"] for v in values] == list(range(len(values)))  # contiguous, no index twice
    assert source.measure_from is not None and source.measure_to is not None
    assert source.measure_from >= 50 and source.measure_to - source.measure_from == 300
    assert source.next == source.measure_to == len(values)
    assert all(isinstance(v["t"], float) and v["user"].startswith("user-") for v in values)
    assert source.finished.is_set()


def test_sink_reports_each_written_value_after_flush_and_pickles(redis_client: redis.Redis,
                                                                 redis_server_url: str, namespace: str) -> None:
    key = f"{namespace}:bench:latency"
    sink = pickle.loads(pickle.dumps(LatencySink(redis_server_url, key)))
    ctx = SinkContext("0", 0, 0)
    sink.write([{"i": 0, "t": 100.0}, {"i": 1, "t": 100.5}], ctx)
    sink.write([{"i": 2, "t": 101.0}], ctx)
    assert redis_client.llen(key) == 0  # nothing reported before the flush
    sink.after_flush(ctx)
    sink.after_flush(ctx)  # nothing new written: no empty report
    sink.write([{"i": 1, "t": 100.5}], ctx)  # a second delivery of record 1
    sink.after_flush(ctx)
    assert redis_client.llen(key) == 2
    collector = Collector(redis_server_url, key)
    collector.poll()
    assert sorted(collector.first) == [0, 1, 2]
    assert collector.deliveries == {0: 1, 1: 2, 2: 1}
    assert [collector.first[i][0] for i in range(3)] == [100.0, 100.5, 101.0]
    assert all(ack > stamp for stamp, ack in collector.first.values())
    collector.poll()  # reads only what is new
    assert collector.deliveries == {0: 1, 1: 2, 2: 1}


def test_collector_is_past_startup_only_after_the_catch_up_rounds(redis_client: redis.Redis,
                                                                  redis_server_url: str, namespace: str) -> None:
    key = f"{namespace}:bench:latency"
    sink = LatencySink(redis_server_url, key)
    ctx = SinkContext("0", 0, 0)
    collector = Collector(redis_server_url, key)
    collector.poll()
    assert collector.marks == [] and not collector.past_startup()  # nothing acked yet
    sink.write([{"i": 0, "t": time.time() - 60.0}], ctx)  # start-up backlog: stamped long ago
    sink.after_flush(ctx)
    for _ in range(3):
        collector.poll()
    assert len(collector.marks) == 1 and not collector.past_startup()  # old records: no catch-up
    for i in range(1, SETTLE_ROUNDS + 1):
        assert not collector.past_startup()
        sink.write([{"i": i, "t": time.time() + 60.0}], ctx)  # stamped after every mark so far
        sink.after_flush(ctx)
        collector.poll()
        assert len(collector.marks) == i + 1
    assert collector.past_startup()


def _collector_with(first: dict[int, tuple[float, float]]) -> Collector:
    collector = Collector.__new__(Collector)
    collector.first = first
    collector.deliveries = dict.fromkeys(first, 1)
    return collector


def test_summarize_measures_only_the_measured_range_and_raises_on_a_lost_record() -> None:
    source = PacedSource(rate_per_s=1000, warmup_s=0.0, measured=4)
    source.next, source.measure_from, source.measure_to = 6, 2, 6
    first = {0: (0.0, 9.0), 1: (0.0, 9.0)}  # warm-up: 9 s, must not count
    first |= {2 + k: (10.0 + k, 10.0 + k + 0.1 * (k + 1)) for k in range(4)}  # 100..400 ms
    result = summarize(_collector_with(first), source)
    assert result["count"] == 4 and result["deliveries"] == 4
    assert result["p50_ms"] == pytest.approx(200.0) and result["max_ms"] == pytest.approx(400.0)
    assert result["p99_ms"] == pytest.approx(400.0)
    del first[1]  # a warm-up record that never arrived still fails the run
    with pytest.raises(LatencyBenchError, match="1 of 6 emitted records never reached the sink"):
        summarize(_collector_with(first), source)


@pytest.mark.spark
def test_short_run_measures_every_record_and_leaves_no_keys(spark: Any, ft_config: FTConfig,
                                                            redis_client: redis.Redis) -> None:
    lines: list[str] = []
    result = bench_latency(spark, ft_config.replace(timeout_s=30.0), rate_per_s=200, duration_s=3.0,
                           warmup_s=1.0, trigger_interval_s=0.5, progress=lines.append)
    assert result["count"] == 600 and result["deliveries"] >= 600
    assert 0 < result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["p99_over_trigger"] == pytest.approx(result["p99_ms"] / 500.0, abs=1e-3)
    assert result["trigger_interval_s"] == 0.5 and result["offered_per_s"] == 200
    assert result["warmup_s"] >= 1.0
    assert result["ingested_per_s"] > 0 and result["acked_per_s"] > 0
    assert result["ft_stats"]["pending"] == 0 and result["ft_stats"]["acked"] >= result["count"]
    assert result["batches"]["count"] >= 1
    assert lines and lines[0].startswith("latency:")
    assert list(redis_client.scan_iter(match=f"{result['namespace']}:*")) == []



@pytest.mark.spark
def test_plain_baseline_measures_spark_alone_under_the_same_load(spark: Any, ft_config: FTConfig,
                                                                 redis_client: redis.Redis) -> None:
    result = plain_latency(spark, ft_config.redis_url or "", rate_per_s=200, duration_s=3.0, warmup_s=2.0,
                           trigger_interval_s=0.5)
    # a rate source of 200 rows/s: about 600 rows due in the measured 3 s, each measured once
    assert 450 <= result["count"] <= 750
    assert 0 < result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert result["p99_over_trigger"] == pytest.approx(result["p99_ms"] / 500.0, abs=1e-3)
    assert result["batches"]["count"] >= 1
    assert list(redis_client.scan_iter(match="benchplainlat*")) == []

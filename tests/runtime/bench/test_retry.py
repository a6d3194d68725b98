"""The task-retry benchmark: on local[2,4] a killed sink worker's retry writes again only what
was not acked, next to plain Structured Streaming rewriting the whole task."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.bench.retry import bench_retry, count_lines

pytestmark = pytest.mark.spark


def test_count_lines_splits_attempts_and_counts_duplicates(tmp_path: Path) -> None:
    (tmp_path / "p0-a0-11.txt").write_text("0\n2\n4\n")
    (tmp_path / "p0-a1-12.txt").write_text("2\n4\n6\n")
    (tmp_path / "p1-a0-13.txt").write_text("1\n3\n")
    got = count_lines(tmp_path, 8)
    assert got == {"partition_records": 4, "written_before_kill": 3, "rewritten_by_retry": 3,
                   "sink_duplicates": 2, "lost": 2}  # 5 and 7 never written


def test_retry_bench_ftlayer_rewrites_less_than_spark(redis_server_url: str, tmp_path: Path) -> None:
    res = bench_retry(redis_server_url, records=8000, repeats=1, workdir=tmp_path)
    assert res["all_killed"] and res["lost_total"] == 0
    ft, spark = res["rounds"][0]["ftlayer"], res["rounds"][0]["spark"]
    assert ft["written_before_kill"] == spark["written_before_kill"] == 2000
    # Spark's retry re-runs the whole task and duplicates everything the dead attempt wrote
    assert spark["rewritten_by_retry"] == spark["partition_records"]
    assert spark["sink_duplicates"] == spark["written_before_kill"]
    # ftlayer acked the first 1000 (sink_ack_every_records, checked after each 250-row Arrow
    # batch) and died writing the next 1000: its retry skips the acked ones
    assert ft["rewritten_by_retry"] == ft["partition_records"] - 1000
    assert ft["sink_duplicates"] == 1000
    assert res["retry_duplicates_vs_spark"]["median"] == 0.5
    assert ft["acked"] == 8000 and ft["pending_after"] == 0 and ft["timeout_replays"] == 0

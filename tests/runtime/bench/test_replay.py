"""The replay-precision benchmark: a killed worker's batch is recovered by re-running only what it lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.bench.replay import ReplayBenchError, bench_replay, failed_batch_records
from runtime.bench.replay_app import read_passes


def _offset_file(checkpoint: Path, batch: int, offset: dict[str, str]) -> None:
    path = checkpoint / "offsets" / str(batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(offset) + "\n")


def test_failed_batch_records_counts_the_uncommitted_range(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _offset_file(ckpt, 0, {"ch0": "10-0", "ch1": "0-0"})
    _offset_file(ckpt, 1, {"ch0": "30-0", "ch1": "20-1"})
    (ckpt / "commits").mkdir()
    (ckpt / "commits" / "0").write_text("v1\n{}\n")
    entries = {0: [("10-0", 5), ("20-0", 7), ("30-0", 11), ("40-0", 13)], 1: [("20-0", 2), ("20-1", 3), ("21-0", 4)]}
    # batch 1 = ch0 (10-0, 30-0] and ch1 (0-0, 20-1]: start exclusive, end inclusive
    assert failed_batch_records(ckpt, entries) == (1, 7 + 11 + 2 + 3)
    (ckpt / "commits" / "1").write_text("v1\n{}\n")
    with pytest.raises(ReplayBenchError, match="no uncommitted batch"):
        failed_batch_records(ckpt, entries)


def test_read_passes_counts_every_pass(tmp_path: Path) -> None:
    (tmp_path / "phase2-11.txt").write_text("1\n2\n")
    (tmp_path / "phase2-12.txt").write_text("2\n")
    (tmp_path / "phase1-11.txt").write_text("7\n")
    assert sorted(read_passes(tmp_path, 2)) == [1, 2, 2]


@pytest.mark.spark
def test_only_the_records_lost_in_flight_are_processed_again(redis_server_url: str, tmp_path: Path) -> None:
    records = 2000
    res = bench_replay(redis_server_url, records=records, repeats=1, workdir=tmp_path)
    (r,) = res["rounds"]
    assert r["other_tasks_flushed_first"], r  # the fault hit a batch whose other task had completed
    assert 0 < r["lost_in_flight"] < records
    assert r["lost_in_flight"] == r["records_per_partition"][r["killed_partition"]]  # acks flush per task
    # the property: the re-run batch processes exactly the records whose trees the fault lost
    assert r["reprocessed"] == r["lost_in_flight"] and r["same_ids"]
    assert res["replay_precision"] == 1.0
    # Spark's recovery re-runs the whole batch
    assert r["spark_rerun"] == records and res["spark_rerun_over_lost_summary"]["median"] > 1.0
    # nothing lost, pending, leaked or replayed by timeout; only the dead task's writes are duplicated
    assert r["delivered"] == records and r["lost"] == 0 and r["pending_after"] == 0 and r["leaked"] == []
    assert r["timeout_replays"] == 0
    assert r["sink_duplicates"] == r["written_before_kill"] > 0
    assert r["ok"] and res["all_ok"]

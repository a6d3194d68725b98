"""Topologies under failure on real Spark and Redis: diamond, killed workers, task retries."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord
from ftlayer.facade.ft_layer import FTLayer
from runtime.driver.ingest import Ingestor
from runtime.sinks import JsonLinesSink
from runtime.testing import once
from runtime.topology import Topology
from tests.runtime.test_topology_e2e import clicks, run_to_drain

pytestmark = pytest.mark.spark


class DieAfterFlush(JsonLinesSink):
    """Kills its worker once, right after the task flushed its acks."""

    def __init__(self, directory: Path, marks: Path) -> None:
        super().__init__(directory)
        self.marks = marks

    def after_flush(self, ctx: Any) -> None:
        if once(self.marks, "die-after-flush"):
            os._exit(4)  # Spark retries the task; the retry flushes the same token again


def test_diamond_each_copy_xored_twice_and_failures_replayed(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    """One source, two branches, union into one sink; failures injected in one branch."""
    n = 600
    topo = Topology("diamond", ft_config.replace(timeout_s=30.0, max_replays=3))
    marks = tmp_path / "marks"

    def left(e: dict[str, Any]) -> dict[str, Any]:
        if e["i"] % 15 == 0 and once(marks, f"L{e['i']}"):
            raise FailRecord("left branch")
        return {"i": e["i"], "branch": "L", "user": e["user"]}

    def right(e: dict[str, Any]) -> dict[str, Any]:
        return {"i": e["i"], "branch": "R", "user": e["user"]}

    src = topo.source("clicks", clicks(n), key=lambda e: e["user"])
    out = JsonLinesSink(tmp_path / "out")
    src.map(left).union(src.map(right)).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    lines = out.read_all()
    by_branch = Counter((line["value"]["branch"], line["value"]["i"]) for line in lines)
    # every record reached the sink through both branches
    assert {i for (b, i) in by_branch if b == "L"} == set(range(n))
    assert {i for (b, i) in by_branch if b == "R"} == set(range(n))
    failed = {i for i in range(n) if i % 15 == 0}
    # no spurious replays: a record that never failed went through each branch exactly once;
    # a failed one went through the left once (its replay) and the right once or twice (the
    # right branch's scan skips a record the left already failed, since it is no longer pending)
    for (branch, i), count in by_branch.items():
        assert count == 1 or (branch == "R" and i in failed and count == 2), (branch, i, count)
    layer = query.layers[0]
    stats = layer.stats()
    # a record completes only when both copies are acked: n originals + one replay per failure
    assert stats["acked"] == n and stats["replayed"] == len(failed) and stats["failed_explicit"] == len(failed)
    # replays carry the same key hash, so every output of a record came from one channel
    # (a union concatenates partitions: the right branch's channel c is partition n + c)
    n_ch = ft_config.num_channels
    channels: dict[int, set[int]] = {}
    for line in lines:
        channels.setdefault(line["value"]["i"], set()).add(line["partition"] % n_ch)
    assert all(len(c) == 1 for c in channels.values())
    assert layer.leftovers() == []


def test_killed_python_worker_loses_nothing(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    """A Python worker dies mid-partition (os._exit); Spark retries the task, nothing is lost."""
    n = 1500
    topo = Topology("killed", ft_config.replace(timeout_s=20.0))
    marks = tmp_path / "marks"

    def maybe_die(e: dict[str, Any]) -> dict[str, Any]:
        if e["i"] == 700 and once(marks, "kill"):
            os._exit(3)  # the worker process vanishes mid-partition, before its flush
        return e

    out = JsonLinesSink(tmp_path / "out")
    topo.source("clicks", clicks(n), key=lambda e: e["user"]).map(maybe_die).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    assert (marks / "kill").exists()
    assert {line["value"]["i"] for line in out.read_all()} == set(range(n))
    assert query.layers[0].leftovers() == []


@pytest.mark.parametrize("every", [0, 1000])
def test_task_dying_after_its_flush_causes_no_spurious_replay(
    spark: Any, ft_config: FTConfig, tmp_path: Path, every: int
) -> None:
    """local[2,4]: the sink task flushes its acks, then dies. Acking once per task, the retry's
    flush is a duplicate the token skips; by default the retry skips the completed rows."""
    n = 800
    topo = Topology("retry", ft_config.replace(timeout_s=20.0, sink_ack_every_records=every))
    marks = tmp_path / "marks"

    out = DieAfterFlush(tmp_path / "out", marks)
    src = topo.source("clicks", clicks(n), key=lambda e: e["user"])
    # the sink stage runs after a shuffle, so its retry re-reads the same rows (a retry of a
    # source-reading task would skip the records its first attempt already acked)
    src.map(lambda e: e).key_by(lambda e: e["user"]).map(lambda e: e).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    assert (marks / "die-after-flush").exists()
    stats = query.layers[0].stats()
    assert stats["acked"] == n and stats["replayed"] == 0 and stats["failed_timeout"] == 0
    lines = out.read_all()
    assert {line["value"]["i"] for line in lines} == set(range(n))
    if every == 0:  # the retry writes its rows again; its flush carries the same token: skipped
        assert stats["duplicate_flushes"] >= 1
    else:  # the retry finds every record of its rows completed: it writes and flushes nothing
        assert len(lines) == n and stats["duplicate_flushes"] == 0


class DieMidTask(JsonLinesSink):
    """The first attempt of the sink task of ``partition`` dies once it wrote ``after`` records;
    ``marks/written-before-kill`` holds how many it wrote."""

    def __init__(self, directory: Path, marks: Path, *, partition: int, after: int) -> None:
        super().__init__(directory)
        self.marks, self.partition, self.after = marks, partition, after
        self._written: dict[str, int] = {}

    def write(self, values: list[Any], ctx: Any) -> None:
        super().write(values, ctx)
        task = f"{ctx.batch_id}/{ctx.partition}/{ctx.attempt}"
        self._written[task] = done = self._written.get(task, 0) + len(values)
        if ctx.partition == self.partition and ctx.attempt == 0 and done >= self.after and once(self.marks, "kill"):
            (self.marks / "written-before-kill").write_text(str(done))
            os._exit(3)  # Spark (local[2,4]) retries the task


@pytest.mark.parametrize("every", [0, 100])
def test_retried_sink_task_writes_again_only_what_was_not_acked(
    spark: Any, ft_config: FTConfig, tmp_path: Path, every: int
) -> None:
    """local[2,4], a keyed shuffle before the sink, every record in the first micro-batch. The
    sink task of partition 0 dies after writing 600 of its ~1000 records in Arrow batches of
    100. With progressive acks every 100 records, its retry skips the 500 acked before the
    kill and writes only the rest again: 100 duplicates at the sink. Acking once per task
    (``every`` = 0), the retry writes all 600 again, as Spark's own task retry does."""
    n, arrow_rows = 2000, 100
    cfg = ft_config.replace(timeout_s=60.0, sink_ack_every_records=every)
    layer = FTLayer(cfg, "rewrites", "clicks", num_channels=cfg.num_channels).open()
    Ingestor(layer, clicks(n), key=lambda e: e["user"]).run()  # all in the first micro-batch
    assert layer.pending_count() == n
    marks = tmp_path / "marks"
    marks.mkdir()
    out = DieMidTask(tmp_path / "out", marks, partition=0, after=600)
    topo = Topology("rewrites", cfg)
    topo.source("clicks", [], key=lambda e: e["user"]).map(lambda e: e).key_by(lambda e: e["user"]).sink(out)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(arrow_rows))
    try:
        query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
        run_to_drain(query)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    written_before_kill = int((marks / "written-before-kill").read_text())
    lines = out.read_all()
    assert {line["value"]["i"] for line in lines} == set(range(n))  # nothing lost
    duplicates = len(lines) - n
    stats = query.layers[0].stats()
    assert stats["acked"] == n and stats["replayed"] == 0 and stats["failed_timeout"] == 0
    assert written_before_kill == 600
    if every == 0:
        assert duplicates == written_before_kill
    else:
        assert duplicates == written_before_kill - 500  # the Arrow batch written after the last ack
    assert query.layers[0].leftovers() == []
    # the retry writes each value under the lineage id its first attempt wrote it under (issue 27)
    lineages = {line["value"]["i"]: {line["lineage"]} for line in lines}
    for line in lines:
        lineages[line["value"]["i"]].add(line["lineage"])
    assert all(len(ids) == 1 for ids in lineages.values())
    assert len(set.union(*lineages.values())) == n


class FailAfterWrite(JsonLinesSink):
    """Writes its first batch, then fails it once (a sink whose write landed but whose caller
    saw an error): every record of it is replayed and written again."""

    def __init__(self, directory: Path, marks: Path) -> None:
        super().__init__(directory)
        self.marks = marks

    def write(self, values: list[Any], ctx: Any) -> None:
        super().write(values, ctx)
        if values and once(self.marks, "fail-after-write"):
            msg = "the write landed, the reply was lost"
            raise OSError(msg)


def test_a_replay_of_a_written_record_carries_its_first_lineage_id_through_a_flat_map(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    """Each record is split into 3 outputs by a flat_map behind a keyed shuffle; the sink's
    first write fails after it landed, so its records are replayed under new source record ids.
    Every written output has one lineage id across both attempts, and the 3 outputs of a record
    have 3 different ones (issue 27, item 1)."""
    n = 200
    topo = Topology("lineage", ft_config.replace(timeout_s=30.0))
    marks = tmp_path / "marks"
    out = FailAfterWrite(tmp_path / "out", marks)
    src = topo.source("clicks", clicks(n), key=lambda e: e["user"])
    src.flat_map(lambda e: [{"i": e["i"], "part": p} for p in range(3)]).key_by(lambda e: e["i"]).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    stats = query.layers[0].stats()
    lines = out.read_all()
    replayed = [line for line in lines if line["replay"]]
    assert stats["replayed"] > 0 and replayed
    ids: dict[tuple[int, int], set[str]] = {}
    for line in lines:
        ids.setdefault((line["value"]["i"], line["value"]["part"]), set()).add(line["lineage"])
    assert set(ids) == {(i, p) for i in range(n) for p in range(3)}  # nothing lost
    assert all(len(lineage) == 1 for lineage in ids.values())  # stable across the replay
    assert len(set.union(*ids.values())) == 3 * n  # unique among a record's outputs and across records
    assert len(lines) > 3 * n  # the replay did write again: a sink keyed by lineage id drops those

"""The per-task acking stream writer (``writeStream.format(ftlayer.acking_sink(spark, fn))``) on real Spark.

Each test writes with a per-task function into JSON-lines files (one per task attempt), then
reads the files back and counts them against what the source produced. Every test ends with
nothing lost, no record timed out (filtered records were acked at commit), nothing pending,
and the query up.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import ftlayer
from ftlayer.config import FTConfig
from runtime.testing import once
from tests.runtime.test_dataframe import Run, _records

pytestmark = pytest.mark.spark


@pytest.fixture
def run(spark: Any, ft_config: FTConfig, tmp_path: Path) -> Callable[..., Run]:
    return lambda n, **kw: Run(spark, ft_config, tmp_path, n, **kw)


def _files_writer(out: Path, fail_when: Callable[[dict[str, Any]], bool] | None = None,
                  kill_when: Callable[[dict[str, Any]], bool] | None = None) -> Callable[[Iterator[Any]], None]:
    out.mkdir(parents=True, exist_ok=True)

    def write_rows(rows: Iterator[Any]) -> None:
        lines = []
        for row in rows:
            d = row.asDict(recursive=True)
            d.pop("_ftlayer", None)
            if kill_when is not None and kill_when(d):
                os._exit(3)  # the write task's Python worker vanishes; Spark retries the task
            if fail_when is not None and fail_when(d):
                msg = f"destination refused row {d['i']}"
                raise OSError(msg)
            lines.append(json.dumps(d, default=str))
        (out / f"{uuid.uuid4().hex}.jsonl").write_text("\n".join(lines))

    return write_rows


def _written(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in out.iterdir() for line in p.read_text().splitlines() if line]


def _start(r: Run, df: DataFrame, fn: Callable[[Iterator[Any]], None], *, arrow: bool = False,
           **sink_kw: Any) -> Run:
    fmt = ftlayer.acking_sink(r.spark, fn, name=f"ftlayer-sink-{r.name}", arrow=arrow, config=r.cfg, **sink_kw)
    r.handle.ingest(_records(r.n))
    r.query = (df.writeStream.format(fmt).option("checkpointLocation", str(r.tmp / "ck"))
               .trigger(processingTime="500 milliseconds").start())
    return r


def test_filter_and_explode_across_partitions_ack_at_commit(run: Callable[..., Run], tmp_path: Path) -> None:
    r = run(1500)
    out = tmp_path / "out"
    df = (r.df.filter(F.col("i") % 5 != 0).select("i", F.explode("tags").alias("tag"), "_ftlayer")
          .repartition(3, "tag").withColumn("part", F.spark_partition_id()))
    stats = _start(r, df, _files_writer(out)).finish()
    rows = _written(out)
    kept = {i for i in range(1500) if i % 5}
    assert {(row["i"], row["tag"]) for row in rows} == {(i, f"t{k}") for i in kept for k in range(3)}
    parts: dict[int, set[int]] = {}
    for row in rows:
        parts.setdefault(row["i"], set()).add(row["part"])
    assert sum(1 for p in parts.values() if len(p) > 1) > 100  # a record's rows really sat in several tasks
    assert stats["acked"] == 1500 and stats["replayed"] == 0  # the filtered fifth acked, not timed out


def test_a_failed_write_task_is_retried_in_the_task_and_replays_nothing(
    run: Callable[..., Run], tmp_path: Path,
) -> None:
    r = run(2000)
    out, marks = tmp_path / "out", tmp_path / "marks"

    def refuse_once(row: dict[str, Any]) -> bool:
        return row["i"] == 1234 and once(marks, "refuse")

    df = r.df.select("i", "_ftlayer").repartition(4)
    stats = _start(r, df, _files_writer(out, fail_when=refuse_once)).finish()
    assert (marks / "refuse").exists()
    assert sorted(row["i"] for row in _written(out)) == list(range(2000))  # each once: the retry wrote it
    assert stats["failed_explicit"] == stats["replayed"] == 0, stats


def test_a_write_task_that_fails_past_its_retries_replays_only_its_own_records(
    run: Callable[..., Run], tmp_path: Path,
) -> None:
    r = run(2000, sink_retry_budget_s=0.0)
    out, marks = tmp_path / "out", tmp_path / "marks"

    def refuse_once(row: dict[str, Any]) -> bool:
        return row["i"] == 1234 and once(marks, "refuse")

    df = r.df.select("i", "_ftlayer").repartition(4)
    stats = _start(r, df, _files_writer(out, fail_when=refuse_once), stateful=False).finish()
    assert (marks / "refuse").exists()
    assert {row["i"] for row in _written(out)} == set(range(2000))
    # the failed task held about a quarter of its batch: only those records were replayed
    assert 0 < stats["failed_explicit"] == stats["replayed"] < 1000, stats


def test_poison_row_in_a_udf_dead_letters_only_its_record(run: Callable[..., Run], tmp_path: Path) -> None:
    r = run(800, max_replays=1, replay_backoff_initial_s=0.1, replay_backoff_max_s=0.2)
    out = tmp_path / "out"

    def parse(i: int) -> str:
        if i % 200 == 3:
            msg = f"poison {i}"
            raise ValueError(msg)
        return f"ok{i}"

    df = r.df.withColumn("p", ftlayer.udf(parse, "string")("i")).select("i", "p", "_ftlayer")
    stats = _start(r, df, _files_writer(out), arrow=False).finish(dead=4)
    assert stats["dead_lettered"] == 4
    assert {row["i"] for row in _written(out) if row["p"] is not None} == {i for i in range(800) if i % 200 != 3}


def test_killed_python_worker_in_the_write_task_loses_nothing(run: Callable[..., Run], tmp_path: Path) -> None:
    r = run(2000)
    out, marks = tmp_path / "out", tmp_path / "marks"

    def kill_once(row: dict[str, Any]) -> bool:
        return row["i"] == 1500 and once(marks, "kill")

    stats = _start(r, r.df.select("i", "_ftlayer"), _files_writer(out, kill_when=kill_once)).finish()
    assert (marks / "kill").exists()
    assert {row["i"] for row in _written(out)} == set(range(2000))
    assert stats["acked"] == 2000


def test_arrow_writer_gets_record_batches(run: Callable[..., Run], tmp_path: Path) -> None:
    r = run(1000)
    out = tmp_path / "out"
    out.mkdir()

    def write_batches(batches: Iterator[Any]) -> None:
        ids = [i for b in batches for i in b.column("i").to_pylist()]
        (out / f"{uuid.uuid4().hex}.json").write_text(json.dumps(ids))

    stats = _start(r, r.df.filter("i % 2 = 0").select("i", "_ftlayer"), write_batches, arrow=True).finish()
    got = [i for p in out.iterdir() for i in json.loads(p.read_text())]
    assert sorted(got) == list(range(0, 1000, 2))
    assert stats["acked"] == 1000


def test_without_the_metadata_column_a_failed_write_replays_the_whole_batch(
        run: Callable[..., Run], tmp_path: Path) -> None:
    r = run(600, sink_retry_budget_s=0.0)
    out, marks = tmp_path / "out", tmp_path / "marks"

    def refuse_once(row: dict[str, Any]) -> bool:
        return row["i"] == 300 and once(marks, "refuse")

    stats = _start(r, r.df.select("i"), _files_writer(out, fail_when=refuse_once), stateful=False).finish()
    assert {row["i"] for row in _written(out)} == set(range(600))
    # rows cannot be traced to records: every still-pending record of that batch failed and replayed
    assert stats["failed_explicit"] == stats["replayed"] > 0

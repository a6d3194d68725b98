"""The DataFrame path on real Spark and a real server: readStream ... writeStream with batch acks.

Every test ends with: every record the source produced written (or, for poison
records, dead-lettered), no record timed out (filtered rows were acked, not
left to expire), nothing pending, and the query still active.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import ftlayer
from ftlayer.config import FTConfig
from runtime.dataframe import sources
from runtime.testing import once

pytestmark = pytest.mark.spark

SCHEMA = "i long, user string, tags array<string>, ts timestamp"
WAIT_S = 240.0  # generous: a loaded 2-core machine


def _records(n: int) -> list[dict[str, Any]]:
    base = 1_700_000_000
    return [{"i": i, "user": f"u{i % 7}", "tags": [f"t{i % 3}", f"t{(i + 1) % 3}", f"t{(i + 2) % 3}"],
             "ts": base + i // 50} for i in range(n)]


class Run:
    """One DataFrame pipeline over a fresh source: ingest, query, wait for the drain."""

    def __init__(self, spark: Any, cfg: FTConfig, tmp: Path, n: int, **cfg_overrides: Any) -> None:
        self.spark = spark
        self.cfg = cfg.replace(**{"timeout_s": 60.0, **cfg_overrides})
        self.tmp = tmp
        self.n = n
        self.name = "df" + uuid.uuid4().hex[:8]
        self.handle = sources.source(self.name, "events", config=self.cfg, num_channels=2)
        self.df = ftlayer.read_stream(spark, self.name, "events", schema=SCHEMA, config=self.cfg, num_channels=2)
        self.query: Any = None
        self.ingest_schema: str | None = None

    def start(self, out: DataFrame, write: Callable[[DataFrame, int], Any], records: Any = None,
              mode: str = "append", ingest_schema: str | None = None, **acking_kw: Any) -> Run:
        self.ingest_schema = ingest_schema
        self.handle.ingest(_records(self.n) if records is None else records, schema=ingest_schema)
        self.query = (out.writeStream.outputMode(mode)
                      .foreachBatch(ftlayer.acking(write, config=self.cfg, **acking_kw))
                      .option("checkpointLocation", str(self.tmp / "ck"))
                      .trigger(processingTime="500 milliseconds").start())
        return self

    def drained(self, *, dead: int = 0) -> dict[str, int]:
        """Wait until every record is acked or dead-lettered; returns the stats."""
        deadline = time.monotonic() + WAIT_S
        while True:
            stats = self.handle.stats()
            if self.query.exception() is not None:
                raise AssertionError(str(self.query.exception()))
            store = self.handle.layer.store
            settled = stats["acked"] + stats["dead_lettered"] == self.n
            # a record dead-lettered at ingest (a schema checked there) is never persisted
            persisted = self.n - (dead if self.ingest_schema else 0)
            if stats["persisted"] == persisted and settled and self.handle.layer.pending_count() == 0 \
                    and store.client.hlen(store.keys.failed) == 0 and stats["dead_lettered"] == dead:
                return stats
            if time.monotonic() > deadline:
                msg = f"not drained after {WAIT_S} s: {stats}, pending {self.handle.layer.pending_count()}"
                raise AssertionError(msg)
            time.sleep(0.5)

    def finish(self, *, dead: int = 0) -> dict[str, int]:
        try:
            stats = self.drained(dead=dead)
            assert self.query.isActive  # the query is up
            assert stats["failed_timeout"] == 0, stats  # filtered records were acked, not timed out
            return stats
        finally:
            if self.query is not None:
                self.query.stop()
            self.handle.stop()


@pytest.fixture
def run(spark: Any, ft_config: FTConfig, tmp_path: Path) -> Callable[..., Run]:
    return lambda n, **kw: Run(spark, ft_config, tmp_path, n, **kw)


def _collector() -> tuple[list[Any], Callable[[DataFrame, int], None]]:
    rows: list[Any] = []

    def write(df: DataFrame, _batch_id: int) -> None:
        rows.extend(r.asDict() for r in df.collect())

    return rows, write


def test_filter_acks_filtered_records(run: Callable[..., Run]) -> None:
    r = run(3000)
    rows, write = _collector()
    r.start(r.df.filter(F.col("i") % 3 == 0).select("i", "user", "_ftlayer.sid"), write)
    stats = r.finish()
    assert {row["i"] for row in rows} == set(range(0, 3000, 3))
    assert stats["acked"] == 3000


def test_explode_children_in_different_partitions(run: Callable[..., Run]) -> None:
    r = run(1500)
    rows, write = _collector()
    exploded = r.df.select("i", F.explode("tags").alias("tag")).repartition(2, "tag")

    def write_parts(df: DataFrame, batch_id: int) -> None:
        write(df.withColumn("part", F.spark_partition_id()), batch_id)

    r.start(exploded, write_parts)
    r.finish()
    children: dict[int, set[int]] = {}
    for row in rows:
        children.setdefault(row["i"], set()).add(row["part"])
    assert set(children) == set(range(1500))
    assert sum(1 for parts in children.values() if len(parts) > 1) > 100  # children really split
    assert len({(row["i"], row["tag"]) for row in rows}) == 3 * 1500


def test_stream_static_join(run: Callable[..., Run], spark: Any) -> None:
    r = run(2000)
    users = spark.createDataFrame([(f"u{k}", f"team{k % 2}") for k in range(5)], "user string, team string")
    rows, write = _collector()
    r.start(r.df.join(users, "user").select("i", "team"), write)  # u5 and u6 join nothing
    r.finish()
    assert {row["i"] for row in rows} == {i for i in range(2000) if i % 7 < 5}


def test_windowed_aggregation_with_watermark(run: Callable[..., Run]) -> None:
    r = run(2000)
    latest: dict[tuple[Any, str], int] = {}

    def write(df: DataFrame, _batch_id: int) -> None:
        for row in df.collect():
            latest[(row["window"]["start"], row["user"])] = row["count"]

    counts = (r.df.withWatermark("ts", "10 seconds")
              .groupBy(F.window("ts", "5 seconds"), "user").count())
    r.start(counts, write, mode="update")
    r.finish()
    assert sum(latest.values()) == 2000  # every record folded into the state exactly once


def test_poison_row_in_udf_dead_letters_only_its_record(run: Callable[..., Run]) -> None:
    r = run(1000, max_replays=1, replay_backoff_initial_s=0.1, replay_backoff_max_s=0.2)

    def parse(i: int) -> str:
        if i % 100 == 7:
            msg = f"poison {i}"
            raise ValueError(msg)
        return f"ok{i}"

    rows, write = _collector()
    parsed = r.df.withColumn("p", ftlayer.udf(parse, "string")("i"))
    r.start(parsed.select("i", "p"), write)
    stats = r.finish(dead=10)
    assert stats["dead_lettered"] == 10  # the 10 poison records, after their replay
    assert stats["failed_explicit"] == 20  # each failed once, then once more on its replay
    assert {row["i"] for row in rows if row["p"] is not None} == {i for i in range(1000) if i % 100 != 7}


def test_value_that_does_not_fit_the_schema_is_dead_lettered(run: Callable[..., Run]) -> None:
    r = run(500, max_replays=1, replay_backoff_initial_s=0.1, replay_backoff_max_s=0.2)
    records = _records(500)
    for rec in records[::100]:
        rec["i"] = "not a number"
    rows, write = _collector()
    r.start(r.df.select("user", "_ftlayer.origin"), write, records=records)
    stats = r.finish(dead=5)
    assert stats["dead_lettered"] == 5
    assert len(rows) == 495


def test_a_schema_given_at_ingest_dead_letters_a_misfit_before_any_read(run: Callable[..., Run]) -> None:
    """The same records as above, the schema also given to ingest: the 5 misfits are dead-lettered there
    at once with the read's reason, so no read fails them and nothing is replayed."""
    r = run(500, max_replays=1, replay_backoff_initial_s=0.1, replay_backoff_max_s=0.2)
    records = _records(500)
    for rec in records[::100]:
        rec["i"] = "not a number"
    rows, write = _collector()
    r.start(r.df.select("user", "_ftlayer.origin", "_ftlayer.replay"), write, records=records, ingest_schema=SCHEMA)
    stats = r.finish(dead=5)
    assert stats["persisted"] == 495 and stats["dead_lettered"] == 5 and stats["replayed"] == 0, stats
    assert len(rows) == 495 and {row["replay"] for row in rows} == {0}
    reasons = [d.reason for d in r.handle.layer.dead_letters.list()]
    assert len(reasons) == 5
    assert all(x.startswith("ingest: does not fit the schema: column 'i' (bigint)") for x in reasons), reasons


def test_the_read_hands_spark_the_columns_kept_at_ingest(run: Callable[..., Run]) -> None:
    """A source ingested with the query's schema keeps each chunk's values as Arrow columns
    (ftlayer.records.chunk_columns), and the read hands Spark those instead of decoding the payloads.
    Shown with chunks whose columns hold other values than their payloads (i + 10,000; no real
    writer does that): the query sees the columns' values, every type of SCHEMA intact, in Spark's
    executors with the schema Spark hands the reader."""
    from ftlayer.records.keyhash import key_hash, pmod
    from runtime.spark.ddl import parse_schema
    from runtime.spark.schema_check import SchemaCheck
    from serialization.payload import pack_payload

    r = run(600)
    records = _records(600)
    shifted = [{**rec, "i": rec["i"] + 10_000} for rec in records]
    bad, columns = SchemaCheck(parse_schema(SCHEMA)).with_columns([pack_payload(v) for v in shifted])
    assert not bad
    hashes = [key_hash(rec["user"]) for rec in records]
    layer = r.handle.layer
    chunks = layer.new_chunks([pack_payload(v) for v in records], hashes, [pmod(h, 2) for h in hashes],
                              columns=columns)
    assert layer.persist_chunks(chunks) == 600
    rows, write = _collector()
    r.start(r.df.select("i", "user", "tags", "ts"), write, records=[])
    r.finish()
    got = sorted(rows, key=lambda row: row["i"])
    assert [row["i"] for row in got] == list(range(10_000, 10_600))
    assert [(row["user"], row["tags"], int(row["ts"].timestamp())) for row in got] == \
        [(rec["user"], rec["tags"], rec["ts"]) for rec in records]


def test_map_in_pandas_isolates_poison_rows(run: Callable[..., Run]) -> None:
    r = run(800, max_replays=0)

    def double(pdf: Any) -> Any:
        if (pdf["i"] % 200 == 13).any():
            msg = "poison in this frame"
            raise ValueError(msg)
        return pdf.assign(j=pdf["i"] * 2)[["i", "j", "_ftlayer"]]

    rows, write = _collector()
    out = ftlayer.map_in_pandas(r.df, double, ftlayer.with_metadata("i long, j long"))
    r.start(out.select("i", "j"), write)
    stats = r.finish(dead=4)
    assert stats["dead_lettered"] == 4
    assert {row["i"] for row in rows} == {i for i in range(800) if i % 200 != 13}


def test_killed_python_worker_in_the_sink_stage_loses_nothing(run: Callable[..., Run], tmp_path: Path) -> None:
    r = run(2000)
    marks, out_dir = tmp_path / "marks", tmp_path / "out"
    out_dir.mkdir()

    def write_partition(rows: Any) -> None:
        lines = []
        for row in rows:
            if row["i"] == 1200 and once(marks, "kill"):
                os._exit(3)  # the sink's Python worker vanishes mid-write; Spark retries the task
            lines.append(json.dumps({"i": row["i"]}))
        (out_dir / f"{uuid.uuid4().hex}.jsonl").write_text("\n".join(lines))

    def write(df: DataFrame, _batch_id: int) -> None:
        df.foreachPartition(write_partition)

    r.start(r.df.filter(F.col("i") % 2 == 0).select("i"), write)
    r.finish()
    assert (marks / "kill").exists()
    written = {json.loads(line)["i"] for p in out_dir.iterdir() for line in p.read_text().splitlines() if line}
    assert written == set(range(0, 2000, 2))


def test_a_failed_write_is_retried_in_place_and_replays_nothing(run: Callable[..., Run], tmp_path: Path) -> None:
    r = run(1000)
    marks = tmp_path / "marks"
    rows: list[Any] = []

    def write(df: DataFrame, batch_id: int) -> None:
        got = [x.asDict() for x in df.collect()]
        if got and once(marks, "fail-write"):
            msg = f"sink down for batch {batch_id}"
            raise OSError(msg)
        rows.extend(got)

    r.start(r.df.select("i", "_ftlayer.replay"), write)
    stats = r.finish()
    assert (marks / "fail-write").exists()
    assert stats["failed_explicit"] == 0 and stats["replayed"] == 0, stats
    assert sorted(row["i"] for row in rows) == list(range(1000))  # each once: the retry wrote them
    assert all(row["replay"] == 0 for row in rows)


def test_a_write_that_fails_past_its_retries_replays_the_batch_of_a_stateless_plan(
    run: Callable[..., Run], tmp_path: Path,
) -> None:
    r = run(1000, sink_retry_budget_s=0.0)  # no retry: the first failure gives up
    marks = tmp_path / "marks"
    rows: list[Any] = []
    failed_attempt: list[Any] = []

    def write(df: DataFrame, batch_id: int) -> None:
        got = [x.asDict() for x in df.collect()]
        if got and once(marks, "fail-write"):
            failed_attempt.extend(got)  # what a sink that wrote before it failed would hold
            msg = f"sink down for batch {batch_id}"
            raise OSError(msg)
        rows.extend(got)

    # on_error="auto": stateless, so "replay"
    r.start(r.df.select("i", "_ftlayer.replay", "_ftlayer.sid", "_ftlayer.lineage"), write)
    stats = r.finish()
    assert stats["failed_explicit"] > 0 and stats["replayed"] == stats["failed_explicit"]
    assert {row["i"] for row in rows} == set(range(1000))
    assert any(row["replay"] == 1 for row in rows)
    # lineage ids (issue 27): a replay comes under a new sid with its first attempt's lineage id
    lineage_of = {row["i"]: row["lineage"] for row in rows}
    assert len(set(lineage_of.values())) == 1000
    assert failed_attempt and all(
        lineage_of[row["i"]] == row["lineage"] and row["sid"] not in {x["sid"] for x in rows if x["i"] == row["i"]}
        for row in failed_attempt
    )


def test_with_column_drops_a_failed_row_so_an_aggregate_counts_its_record_once(
    run: Callable[..., Run], tmp_path: Path,
) -> None:
    """Issue 27 item 3: 100 of 700 records fail once in the row function, then pass on replay. With
    ``with_column`` the failed rows never reach ``groupBy().count()``: every section counts each
    of its records once, and there is no null section. (The column form counts a null section
    for each failed attempt: checked.)"""
    r = run(700)
    marks = tmp_path / "marks"

    def parse(i: int) -> str:
        if i % 7 == 0 and once(marks, f"r{i}"):  # the first attempt of every 7th record fails
            msg = f"first attempt of {i}"
            raise ValueError(msg)
        return f"s{i % 5}"

    counts = ftlayer.udf(parse, "string").with_column(r.df, "section", "i").groupBy("section").count()
    latest: dict[Any, int] = {}

    def write(df: DataFrame, _batch_id: int) -> None:
        latest.clear()
        latest.update({row["section"]: row["count"] for row in df.collect()})

    r.start(counts, write, mode="complete")
    stats = r.finish()
    assert stats["failed_explicit"] == 100 and stats["replayed"] == 100, stats
    assert latest == {f"s{k}": 140 for k in range(5)}, latest

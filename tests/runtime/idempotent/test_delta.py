"""runtime.idempotent.delta on real Delta tables (delta-rs) in tmp_path, read back and counted."""

from __future__ import annotations

import collections
import pickle
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from runtime.idempotent.delta import DeltaConflictError, DeltaSink, DeltaSinkError, DeltaWriter, delta_sink
from runtime.sinks import SinkContext


def read(uri: str | Path) -> list[dict[str, Any]]:
    return sorted(DeltaTable(str(uri)).to_pyarrow_table().to_pylist(), key=lambda r: r["lineage_id"])


def keys(uri: str | Path) -> collections.Counter[str]:
    return collections.Counter(r["lineage_id"] for r in read(uri))


def batch(ids: list[str], values: list[int] | None = None) -> pa.Table:
    return pa.table({"lineage_id": ids, "v": values if values is not None else list(range(len(ids)))})


def test_the_first_write_creates_the_table(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    assert not DeltaTable.is_deltatable(uri)
    assert DeltaWriter(uri).write(batch(["a", "b"])) == 2
    assert read(uri) == [{"lineage_id": "a", "v": 0}, {"lineage_id": "b", "v": 1}]
    assert DeltaTable(uri).version() == 0


def test_a_batch_written_twice_holds_each_row_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    writer = DeltaWriter(uri)
    assert writer.write(batch(["a", "b", "c"])) == 3
    assert writer.write(batch(["a", "b", "c"])) == 0
    # a RecordBatch, overlapping: only the new key is inserted; the old rows keep their values
    assert DeltaWriter(uri).write(pa.RecordBatch.from_pydict({"lineage_id": ["c", "d"], "v": [99, 3]})) == 1
    assert keys(uri) == {"a": 1, "b": 1, "c": 1, "d": 1}
    assert {r["lineage_id"]: r["v"] for r in read(uri)}["c"] == 2  # first write wins


def test_duplicates_within_a_batch_insert_once_the_first_wins(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    writer = DeltaWriter(uri)
    assert writer.write(batch(["a", "b", "a", "b", "a"], [1, 2, 3, 4, 5])) == 2  # the create path
    assert writer.write(batch(["c", "a", "c"], [6, 7, 8])) == 1  # the merge path
    assert read(uri) == [{"lineage_id": "a", "v": 1}, {"lineage_id": "b", "v": 2}, {"lineage_id": "c", "v": 6}]


def test_a_rerun_with_a_committed_txn_version_is_skipped_without_merging(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    writer = DeltaWriter(uri)
    assert writer.write(batch(["a"]), txn=("app", 0)) == 1  # recorded by the create
    assert writer.write(batch(["b"]), txn=("app", 1)) == 1  # recorded by the merge
    assert DeltaTable(uri).transaction_version("app") == 1
    table_version = DeltaTable(uri).version()
    # new keys under versions already committed: skipped (a merge would have inserted them)
    assert DeltaWriter(uri).write(batch(["x"]), txn=("app", 1)) == 0
    assert writer.write(batch(["y"]), txn=("app", 0)) == 0
    assert DeltaTable(uri).version() == table_version
    # another app id, or the next version, merges
    assert writer.write(batch(["a", "c"]), txn=("other", 0)) == 1
    assert writer.write(batch(["d"]), txn=("app", 2)) == 1
    assert keys(uri) == {"a": 1, "b": 1, "c": 1, "d": 1}


class CountingWriter(DeltaWriter):
    """Counts the attempts that lost to a concurrent commit."""

    conflicts = 0
    lock = threading.Lock()

    def _write_once(self, table: pa.Table, txn: tuple[str, int] | None) -> int:
        try:
            return super()._write_once(table, txn)
        except CommitFailedError:
            with self.lock:
                CountingWriter.conflicts += 1
            raise


@pytest.mark.slow
def test_two_threads_merging_overlapping_batches_at_once_end_with_each_key_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    DeltaWriter(uri).write(batch(["seed"]))
    CountingWriter.conflicts = 0
    rounds, barrier = 12, threading.Barrier(2)
    inserted = [0, 0]
    errors: list[BaseException] = []

    def run(n: int) -> None:
        writer = CountingWriter(uri, backoff_s=0.01)
        try:
            for r in range(rounds):
                barrier.wait()  # both merge the same round at the same moment: they conflict
                # 30 keys per round, 20 shared with the other thread's batch of this round
                ids = [f"k{r:02d}-{i:02d}" for i in range(n * 10, n * 10 + 30)]
                inserted[n] += writer.write(batch(ids))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    counts = keys(uri)
    assert len(counts) == 1 + rounds * 40
    assert set(counts.values()) == {1}
    assert sum(inserted) == rounds * 40
    assert CountingWriter.conflicts > 0  # the retry path ran


def test_writers_racing_to_create_the_table_all_land_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    barrier, errors, inserted = threading.Barrier(3), [], []

    def run(n: int) -> None:
        barrier.wait()
        try:
            inserted.append(DeltaWriter(uri, backoff_s=0.01).write(batch(["shared", f"own{n}"])))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert keys(uri) == {"shared": 1, "own0": 1, "own1": 1, "own2": 1}
    assert sum(inserted) == 4


def test_conflicts_past_max_attempts_raise_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = str(tmp_path / "t")
    writer = DeltaWriter(uri, max_attempts=3, backoff_s=0.0)
    calls = []

    def always_conflicts(table: pa.Table, txn: tuple[str, int] | None) -> int:
        calls.append(1)
        raise CommitFailedError("a concurrent transaction added new data")

    monkeypatch.setattr(writer, "_write_once", always_conflicts)
    with pytest.raises(DeltaConflictError, match="lost to concurrent commits 3 times"):
        writer.write(batch(["a"]))
    assert len(calls) == 3


def test_bad_batches_are_refused(tmp_path: Path) -> None:
    writer = DeltaWriter(str(tmp_path / "t"))
    with pytest.raises(DeltaSinkError, match="no key column 'lineage_id'"):
        writer.write(pa.table({"id": ["a"]}))
    with pytest.raises(DeltaSinkError, match="1 rows have a null 'lineage_id'"):
        writer.write(pa.table({"lineage_id": ["a", None]}))
    assert writer.write(pa.table({"lineage_id": pa.array([], pa.string())})) == 0
    assert not DeltaTable.is_deltatable(str(tmp_path / "t"))


def test_a_missing_deltalake_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deltalake", None)  # import deltalake raises ImportError
    with pytest.raises(DeltaSinkError, match=r"pip install 'ftlayer\[delta\]'"):
        DeltaWriter(str(tmp_path / "t"))


def ctx(lineages: list[str], partition: int = 0) -> SinkContext:
    n = len(lineages)
    return SinkContext(batch_id="0", partition=partition, attempt=0, origins=[1] * n, sids=[1] * n,
                       lineages=lineages)


def test_the_topology_sink_writes_each_value_once_by_its_lineage_id(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = pickle.loads(pickle.dumps(DeltaSink(uri, schema=pa.schema([("user", pa.string()), ("n", pa.int64())]))))
    values = [{"user": "u1", "n": 1}, {"user": "u2", "n": 2}, {"user": "u1", "n": 1}]
    sink.write(values, ctx(["l1", "l2", "l3"]))
    sink.write(values[1:], ctx(["l2", "l3"], partition=1))  # a replay of two of them
    sink.write([{"user": "u3", "n": None}], ctx(["l4"]))
    sink.write([], ctx([]))
    rows = read(uri)
    assert [(r["lineage_id"], r["user"], r["n"]) for r in rows] == [
        ("l1", "u1", 1), ("l2", "u2", 2), ("l3", "u1", 1), ("l4", "u3", None)]
    sink = pickle.loads(pickle.dumps(sink))  # its writer held a loaded table: still picklable
    with pytest.raises(DeltaSinkError, match="2 values but 1 lineage ids"):
        sink.write(values[:2], ctx(["l1"]))
    with pytest.raises(DeltaSinkError, match="writes dict values"):
        sink.write(["plain"], ctx(["l9"]))
    with pytest.raises(DeltaSinkError, match="already have a field 'lineage_id'"):
        DeltaSink(uri).write([{"lineage_id": "x"}], ctx(["l9"]))


@pytest.mark.spark
def test_delta_sink_merges_a_dataframe_batch_once_on_its_lineage(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    uri = str(tmp_path / "clicks")
    rows = [(f"l{i}", f"user{i % 3}", i) for i in range(6)] + [("l0", "user0", 0)]  # a duplicate in the batch
    df = (spark.createDataFrame(rows, "lid string, user string, n long")
          .withColumn("_ftlayer", F.struct(F.col("lid").alias("lineage"), F.lit(7).alias("origin")))
          .drop("lid"))
    write = delta_sink(uri, app_id="clicks")
    write(df, 0)
    write(df, 0)  # a re-run of batch 0: skipped by its txn version
    assert DeltaTable(uri).transaction_version("clicks") == 0
    more = (spark.createDataFrame([("l4", "user1", 4), ("l6", "user0", 6)], "lid string, user string, n long")
            .withColumn("_ftlayer", F.struct(F.col("lid").alias("lineage"))).drop("lid"))
    write(more, 1)  # overlapping rows in a later batch: merged, only l6 is new
    delta_sink(uri)(df, 0)  # without a txn: the merge alone drops them
    got = read(uri)
    assert [r["lineage_id"] for r in got] == [f"l{i}" for i in range(7)]
    assert set(got[0]) == {"user", "n", "lineage_id"}
    assert DeltaTable(uri).transaction_version("clicks") == 1

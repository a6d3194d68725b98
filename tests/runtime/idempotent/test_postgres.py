"""The effectively-once Postgres writer and sinks, against a real server."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from runtime.idempotent import postgres as pg_module
from runtime.idempotent.pg_embedded import EmbeddedPostgres
from runtime.idempotent.postgres import (
    PostgresSink,
    PostgresSinkError,
    PostgresWriter,
    UniqueKeyMissingError,
    postgres_sink,
)
from runtime.sinks import SinkContext


def lid(i: int) -> str:
    return f"{i:032x}"


def rows_of(url: str, table: str, order: str = "lineage_id") -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(f'SELECT * FROM "{table}" ORDER BY {order}').fetchall()


@pytest.fixture
def writer(postgres: EmbeddedPostgres, table: str) -> Any:
    w = PostgresWriter(postgres.url, table)
    w.ensure_table({"n": "bigint", "s": "text"})
    yield w
    w.close()


def test_a_batch_written_twice_inserts_once(postgres: EmbeddedPostgres, table: str, writer: PostgresWriter) -> None:
    batch = [{"lineage_id": lid(i), "n": i, "s": f"r{i}"} for i in range(100)]
    assert writer.write(batch) == 100
    assert writer.write(batch) == 0
    # a later batch overlapping the first: only the new half goes in
    assert writer.write([{"lineage_id": lid(i), "n": i, "s": "again"} for i in range(50, 150)]) == 50
    got = rows_of(postgres.url, table)
    assert len(got) == 150
    assert got[60] == (lid(60), 60, "r60")  # the first write wins


def test_duplicates_within_a_batch_insert_once(postgres: EmbeddedPostgres, table: str,
                                               writer: PostgresWriter) -> None:
    batch = [{"lineage_id": lid(1), "n": 1, "s": "first"}, {"lineage_id": lid(2), "n": 2, "s": "x"},
             {"lineage_id": lid(1), "n": 1, "s": "second"}]
    assert writer.write(batch) == 2
    assert rows_of(postgres.url, table) == [(lid(1), 1, "first"), (lid(2), 2, "x")]


def test_a_table_without_a_unique_key_is_refused(postgres: EmbeddedPostgres, table: str) -> None:
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}" (lineage_id text, n bigint)')
    writer = PostgresWriter(postgres.url, table)
    with pytest.raises(UniqueKeyMissingError, match="no unique constraint on column 'lineage_id'"):
        writer.write([{"lineage_id": lid(1), "n": 1}])
    with pytest.raises(UniqueKeyMissingError, match="written twice"):
        writer.ensure_table({"n": "bigint"})  # exists already: not re-created, still refused
    assert rows_of(postgres.url, table) == []
    writer.close()


def test_a_missing_table_is_named(postgres: EmbeddedPostgres, table: str) -> None:
    writer = PostgresWriter(postgres.url, table, create=False)
    with pytest.raises(PostgresSinkError, match=f"table '{table}' does not exist"):
        writer.ensure_table({"n": "bigint"})
    with pytest.raises(PostgresSinkError, match="does not exist"):
        writer.write([{"lineage_id": lid(1), "n": 1}])
    writer.close()


def test_a_dropped_connection_is_reopened(postgres: EmbeddedPostgres, table: str, writer: PostgresWriter) -> None:
    assert writer.write([{"lineage_id": lid(1), "n": 1}]) == 1
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND datname = current_database() AND backend_type = 'client backend'").fetchall()
    assert (True,) in killed
    assert writer.write([{"lineage_id": lid(1), "n": 1}, {"lineage_id": lid(2), "n": 2}]) == 1
    assert [r[0] for r in rows_of(postgres.url, table)] == [lid(1), lid(2)]


def test_a_batch_failing_midway_leaves_nothing(postgres: EmbeddedPostgres, table: str,
                                               writer: PostgresWriter) -> None:
    batch = [{"lineage_id": lid(i), "n": i} for i in range(10)]
    bad = [*batch[:5], {"lineage_id": lid(99), "n": "not a number"}, *batch[5:]]
    with pytest.raises(PostgresSinkError, match="rolled back") as caught:
        writer.write(bad)
    assert isinstance(caught.value.__cause__, psycopg.DataError)
    assert rows_of(postgres.url, table) == []
    assert writer.write(batch) == 10  # the writer is usable afterwards


def test_a_row_without_its_lineage_id_is_refused(writer: PostgresWriter) -> None:
    with pytest.raises(PostgresSinkError, match="no 'lineage_id'"):
        writer.write([{"n": 1}])


def test_topology_sink_keys_by_ctx_lineages(postgres: EmbeddedPostgres, table: str, writer: PostgresWriter) -> None:
    sink = pickle.loads(pickle.dumps(PostgresSink(postgres.url, table)))  # ships to executors
    values = [{"n": 10, "s": "a"}, {"n": 20, "s": "b"}]
    ctx = SinkContext(batch_id="7", partition=0, attempt=0, origins=[1, 2], sids=[1, 2], lineages=[lid(5), lid(6)])
    sink.write(values, ctx)
    # a replay: new attempt, new source record ids, same lineage ids; plus one new value
    replay = SinkContext(batch_id="9", partition=1, attempt=1, origins=[1, 2, 3], sids=[41, 42, 3],
                         lineages=[lid(5), lid(6), lid(7)])
    sink.write([*values, {"n": 30, "s": "c"}], replay)
    assert rows_of(postgres.url, table) == [(lid(5), 10, "a"), (lid(6), 20, "b"), (lid(7), 30, "c")]
    assert pickle.loads(pickle.dumps(sink))._writer is None  # no connection travels
    with pytest.raises(PostgresSinkError, match="lineage ids"):
        sink.write(values, SinkContext(batch_id="1", partition=0, attempt=0))


def test_missing_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(PostgresSinkError, match=r"pip install 'ftlayer\[postgres\]'"):
        pg_module.import_psycopg()


def test_modules_import_without_psycopg() -> None:
    code = ("import sys; sys.modules['psycopg'] = None; "
            "import runtime.idempotent.postgres, runtime.idempotent.pg_embedded; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "ok", done.stderr


def test_postgres_sink_is_picklable() -> None:
    sink = postgres_sink("postgresql://x@127.0.0.1:1/db", "clicks", columns=["a"])
    assert pickle.loads(pickle.dumps(sink)) == sink


@pytest.mark.spark
def test_dataframe_batch_written_twice_holds_each_row_once(spark: Any, postgres: EmbeddedPostgres,
                                                             table: str) -> None:
    from pyspark.sql import functions as F

    writer = PostgresWriter(postgres.url, table)
    writer.ensure_table({"id": "bigint", "name": "text"})
    df = (spark.range(0, 200, numPartitions=2)
          .withColumn("name", F.concat(F.lit("n"), F.col("id").cast("string")))
          .withColumn("_ftlayer", F.struct(F.lpad(F.col("id").cast("string"), 32, "0").alias("lineage"))))
    sink = postgres_sink(postgres.url, table)
    sink(df, 0)
    sink(df, 0)  # acking's in-place retry, or Spark re-running the uncommitted batch
    sink(df.filter("id >= 150").union(df.filter("id < 10")), 1)  # a replay of some rows in a later batch
    got = rows_of(postgres.url, table, order="id")
    assert got == [(f"{i:032d}", i, f"n{i}") for i in range(200)]
    writer.close()


def test_concurrent_writers_of_overlapping_keys_each_land_once(postgres: EmbeddedPostgres, table: str,
                                                               writer: PostgresWriter) -> None:
    import threading

    keys = [lid(i) for i in range(2000)]
    others = [PostgresWriter(postgres.url, table) for _ in range(4)]
    counts: list[int] = []
    errors: list[BaseException] = []

    def run(w: PostgresWriter, order: list[str]) -> None:
        try:
            counts.append(w.write([{"lineage_id": k, "n": 1} for k in order]))
        except BaseException as exc:
            errors.append(exc)

    # opposite orders: without one global insert order two of them could deadlock
    threads = [threading.Thread(target=run, args=(w, keys if i % 2 else keys[::-1])) for i, w in enumerate(others)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(counts) == 2000
    assert len(rows_of(postgres.url, table)) == 2000
    for w in others:
        w.close()


def _arrow(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    schema = pa.schema([("lineage_id", pa.string()), ("n", pa.int64()), ("s", pa.string())])
    return pa.Table.from_pylist(rows, schema=schema)


def test_the_arrow_path_writes_what_the_row_path_writes(postgres: EmbeddedPostgres, table: str,
                                                        writer: PostgresWriter) -> None:
    """CSV made by Arrow: NULL stays NULL, an empty string stays one, quotes, commas, newlines
    and non-ASCII text go through; a key twice keeps its first row; written twice, once."""
    odd = ["", 'a "quoted", text', "two\nlines", "naïve ☃", None, "\\N", "NULL"]
    rows = [{"lineage_id": lid(i), "n": None if i == 3 else i, "s": odd[i % len(odd)]} for i in range(50)]
    rows.append({"lineage_id": lid(7), "n": -1, "s": "second of key 7"})
    table_ = _arrow(rows)
    assert pg_module.csv_ready(table_.schema)
    assert writer.write_arrow(table_) == 50
    assert writer.write_arrow(table_) == 0
    got = rows_of(postgres.url, table)
    assert got == [(r["lineage_id"], r["n"], r["s"]) for r in rows[:50]]


def test_the_arrow_path_refuses_a_row_without_its_lineage_id(writer: PostgresWriter) -> None:
    with pytest.raises(PostgresSinkError, match="lineage_id"):
        writer.write_arrow(_arrow([{"lineage_id": None, "n": 1, "s": "x"}]))


def test_only_flat_scalar_columns_take_the_arrow_path() -> None:
    import pyarrow as pa

    assert pg_module.csv_ready(pa.schema([("a", pa.int32()), ("b", pa.float64()), ("c", pa.bool_()),
                                          ("d", pa.large_string())]))
    assert not pg_module.csv_ready(pa.schema([("a", pa.timestamp("us"))]))
    assert not pg_module.csv_ready(pa.schema([("a", pa.struct([("x", pa.int64())]))]))
    assert not pg_module.csv_ready(pa.schema([("a", pa.list_(pa.int64()))]))

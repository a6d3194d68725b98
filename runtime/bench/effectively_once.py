"""What effectively-once output costs: the same DataFrame pipeline into the same kind of target,
with an at-least-once writer and with the effectively-once sink, side by side.

The pipeline is the DataFrame path as a user writes it, over N click records::

    ftlayer.ingest -> ftlayer.read_stream -> withColumn(n = i * 2) -> filter(i % 10 != 3)
    -> foreachBatch(ftlayer.acking(write))

timed from ``start()`` until every record is acked. Per kind of target:

- **postgres**: at-least-once = each partition COPYed straight into a table without a key, in
  its executor (what a user's plain JDBC-style append does); effectively-once =
  ``ftlayer.postgres_sink`` (COPY to a staging table, ``INSERT ... ON CONFLICT (lineage_id) DO
  NOTHING`` in key order, into a table whose primary key is the lineage id).
- **delta**: at-least-once = ``write_deltalake(mode="append")`` of the batch on the driver;
  effectively-once = ``ftlayer.delta_sink`` (a MERGE on the lineage id, on the driver).

Each run writes a fresh table, so neither pays for what an earlier run left. The variants
alternate inside one SparkSession (order rotated per round) after one uncounted warm-up of each;
the ratio ``effectively_once / at_least_once`` (records/s) is per round.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from runtime.bench.common import BENCH_STOP_GRACE_S, delete_namespace, run_until, summary
from runtime.bench.e2e import make_value
from runtime.driver.query_stop import stop_query

__all__ = ["bench_effectively_once"]

SCHEMA = "i long, user string, page string"
_COLUMNS = {"i": "bigint", "user": "text", "page": "text", "n": "bigint"}


def _append_partition(url: str, table: str, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: COPY the partition into ``table`` (no key, no dedupe), one transaction, as
    CSV made by Arrow: the effectively-once sink's own path minus the stage and the key."""
    import psycopg
    import pyarrow as pa

    from runtime.idempotent.postgres import csv_bytes

    got = list(batches)
    rows = sum(b.num_rows for b in got)
    if rows:
        with psycopg.connect(url) as conn, conn.cursor() as cur:
            copy_sql = psycopg.sql.SQL("COPY {} (i, \"user\", page, n) FROM STDIN (FORMAT csv)").format(
                psycopg.sql.Identifier(table))
            with cur.copy(copy_sql) as copy:
                copy.write(csv_bytes(pa.Table.from_batches(got)))
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


class _PostgresAppend:
    """The at-least-once Postgres write: the user's columns, appended as they come."""

    def __init__(self, url: str, table: str) -> None:
        self.url, self.table = url, table

    def __call__(self, df: Any, _batch_id: int) -> None:
        df.select("i", "user", "page", "n").mapInArrow(partial(_append_partition, self.url, self.table),
                                                        "rows long").collect()


class _DeltaAppend:
    """The at-least-once Delta write: the batch appended on the driver."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, df: Any, _batch_id: int) -> None:
        from deltalake import write_deltalake

        table = df.select("i", "user", "page", "n").toArrow()
        if table.num_rows:
            write_deltalake(self.path, table, mode="append")


def _writer(kind: str, once: bool, url: str, tmp: Path) -> Callable[[Any, int], None]:
    """A fresh target of ``kind`` and the foreachBatch function that writes to it."""
    name = "b" + uuid.uuid4().hex[:12]
    if kind == "postgres":
        from runtime.idempotent.postgres import PostgresWriter, postgres_sink

        if once:
            writer = PostgresWriter(url, name)
            writer.ensure_table(_COLUMNS)
            writer.close()
            return postgres_sink(url, name)
        import psycopg

        with psycopg.connect(url) as conn:
            conn.execute(psycopg.sql.SQL("CREATE TABLE {} (i bigint, \"user\" text, page text, n bigint)")
                         .format(psycopg.sql.Identifier(name)))
        return _PostgresAppend(url, name)
    path = str(tmp / name)
    if once:
        from runtime.idempotent.delta import delta_sink

        return delta_sink(path)
    return _DeltaAppend(path)


def _run(spark: Any, config: FTConfig, records: int, write: Callable[[Any, int], None]) -> float:
    """records/s of one run of the pipeline into ``write``."""
    from pyspark.sql import functions as F

    import ftlayer
    from runtime.dataframe import sources

    ns = "benchonce" + uuid.uuid4().hex[:8]
    cfg = config.replace(namespace=ns, state_dir=TEMP_STATE_DIR, max_pending=max(config.max_pending, records + 1))
    handle = sources.source("benchonce", "events", config=cfg, num_channels=2)
    start = time.perf_counter()
    ingestor = handle.ingest(make_value(i, 0) for i in range(records))
    df = (ftlayer.read_stream(spark, "benchonce", "events", schema=SCHEMA, config=cfg, num_channels=2)
          .withColumn("n", F.col("i") * 2).filter(F.col("i") % 10 != 3))
    query = df.writeStream.foreachBatch(ftlayer.acking(write, config=cfg)).trigger(
        processingTime="100 milliseconds").start()
    try:
        run_until(query, lambda: handle.stats()["acked"] >= records, 0.02)
        elapsed = time.perf_counter() - start
    finally:
        stop_query(query, BENCH_STOP_GRACE_S)
        ingestor.stop()
        handle.stop()
        delete_namespace(cfg.redis_url or "", ns)
    return records / elapsed


def bench_effectively_once(spark: Any, config: FTConfig, records: int, repeats: int, *,
                           postgres_url: str | None = None, on_round: Any = None) -> dict[str, Any]:
    """Both kinds, each variant ``repeats`` times alternating; see the module notes."""
    from runtime.idempotent.pg_embedded import EmbeddedPostgres

    server = None if postgres_url else EmbeddedPostgres().start()
    url = postgres_url or (server.url if server else "")
    out: dict[str, Any] = {"records": records, "pipeline": "ingest, read_stream, withColumn, filter (10 % out), "
                                                         "foreachBatch(acking(write))"}
    try:
        with tempfile.TemporaryDirectory(prefix="ftlayer-bench-once-") as tmp:
            for kind in ("postgres", "delta"):
                variants = {"at-least-once": False, "effectively-once": True}
                for once in variants.values():  # warm-up, uncounted
                    _run(spark, config, min(records, 20_000), _writer(kind, once, url, Path(tmp)))
                rates: dict[str, list[float]] = {name: [] for name in variants}
                ratios: list[float] = []
                names = list(variants)
                for r in range(repeats):
                    order = names[r % 2:] + names[: r % 2]
                    got = {name: _run(spark, config, records, _writer(kind, variants[name], url, Path(tmp)))
                           for name in order}
                    for name, rate in got.items():
                        rates[name].append(rate)
                    ratios.append(got["effectively-once"] / got["at-least-once"])
                    if on_round is not None:
                        on_round(kind, r, got)
                out[kind] = {"records_per_s": {n: summary(v) for n, v in rates.items()},
                             "effectively_once_vs_at_least_once_ratio": summary(ratios)}
    finally:
        if server is not None:
            server.stop()
    return out

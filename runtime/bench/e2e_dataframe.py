"""End-to-end throughput of the DataFrame path: FT on, FT off, and plain Structured Streaming.

The same pipeline in DataFrame operations for every variant, on N small click records::

    withColumn("n", i * 2) -> filter(i % 10 != 3) -> repartition(2, "user") -> withColumn("seen", true)
    -> foreachBatch(fn) where fn counts the batch (the write; Spark computes every row)

- ``ft-on``: ``ftlayer.ingest`` of a generator (persist before visible, a driver thread) and
  ``ftlayer.read_stream`` (typed columns decoded from msgpack in the Python source), with
  ``foreachBatch(ftlayer.acking(fn))``; timed until every record is acked.
- ``ft-on-columnar``: ``ft-on`` with the schema also given to ingest (``handle.ingest(...,
  schema=SCHEMA)``): each record is checked and decoded there, its chunk keeps the values as Arrow
  columns (:mod:`ftlayer.records.chunk_columns`), and the read hands Spark those instead of
  unpacking each payload.
- ``ft-off``: the same ingest and ``read_stream``, but a plain ``foreachBatch(fn)``: records are
  persisted and read, never acked (the run's timeout is longer than the run, so none replays;
  the namespace is deleted afterwards). The difference to ``ft-on`` is the cost of acking (both
  run with ``max_pending`` above N: ingest is never held back by backpressure). The
  DataFrame path has no mode without persistence: without it a record is only in Spark, and
  ``plain`` is that case.
- ``plain``: no ftlayer: the ``rate-micro-batch`` source (50,000 rows per batch) with the same
  columns computed by SQL expressions, the same operations and the same ``fn``; timed until N
  rows were processed.
- ``python-source`` (a reference): no ftlayer either, but the rows come from a trivial PySpark
  Python streaming source (:mod:`runtime.bench.python_source`: 50,000 rows per batch computed by
  Arrow kernels in the read task), as ftlayer's rows do. ``python_source_vs_plain_ratio`` is what
  any Python source costs in PySpark; ``ft_on_vs_python_source_ratio`` is ftlayer's own part.

Variants alternate inside one process (one SparkSession), each repeated after one discarded
full-size warm-up round of each (see :func:`bench_e2e_dataframe`); records per second from
``start()`` until the last record, query start-up included alike. The ratios are per round.
Beside the rates, each variant's CPU per record over the same span (``cpu_us_per_record``: the
whole machine's busy CPU, :class:`runtime.bench.common.Stopwatch`), so that a ratio can be read
against what each variant spends: ft-on's includes ingest (packing, hashing, persisting on the
driver, and building the generator's records), the source's runner process, the read tasks, the
acks and the Redis server.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.store.connection import client_for
from runtime.bench.common import BENCH_STOP_GRACE_S, Stopwatch, run_until, summary
from runtime.bench.e2e import USERS, Run, alternate, cpu_per_record, make_value
from runtime.driver.query_stop import stop_query

SCHEMA = "i long, user string, page string"


def _ops(df: Any) -> Any:
    from pyspark.sql import functions as F

    return (df.withColumn("n", F.col("i") * 2).filter(F.col("i") % 10 != 3)
            .repartition(2, "user").withColumn("seen", F.lit(True)))


class _Counter:
    """The write: count the batch's rows (thread-safe: foreachBatch runs on Spark's stream thread)."""

    def __init__(self) -> None:
        self.rows = 0
        self._lock = threading.Lock()

    def __call__(self, df: Any, _batch_id: int) -> None:
        n = df.count()
        with self._lock:
            self.rows += n


def run_dataframe(spark: Any, config: FTConfig, records: int, *, ft_on: bool, columnar: bool = False) -> Run:
    """One FT-on or FT-off run of the DataFrame pipeline over a fresh namespace; with ``columnar`` the
    records are ingested with the query's schema, so their chunks keep them as Arrow columns."""
    import ftlayer
    from runtime.dataframe import sources

    ns = "benchdf" + uuid.uuid4().hex[:8]
    # ft-off never acks, so backpressure (max_pending) would stop its ingest: both variants run
    # without it, so they differ only in acking; and no timeout may fire during an ft-off run
    cfg = config.replace(namespace=ns, state_dir=TEMP_STATE_DIR, max_pending=max(config.max_pending, records + 1),
                         timeout_s=config.timeout_s if ft_on else 3600.0)
    handle = sources.source("benchdf", "events", config=cfg, num_channels=2)
    counter = _Counter()
    kept = sum(1 for i in range(records) if i % 10 != 3)
    watch = Stopwatch()
    ingestor = handle.ingest((make_value(i, 0) for i in range(records)), schema=SCHEMA if columnar else None)
    df = _ops(ftlayer.read_stream(spark, "benchdf", "events", schema=SCHEMA, config=cfg, num_channels=2))
    fn: Callable[[Any, int], None] = ftlayer.acking(counter, config=cfg) if ft_on else counter
    query = df.writeStream.foreachBatch(fn).trigger(processingTime="100 milliseconds").start()
    try:
        run_until(query, lambda: handle.stats()["acked"] >= records if ft_on
                  else (ingestor.done and counter.rows >= kept), 0.02)
        elapsed, cpu = watch.read()
    finally:
        stop_query(query, BENCH_STOP_GRACE_S)
        handle.stop()
        _drop_namespace(cfg)
    return Run(("ft-on-columnar" if columnar else "ft-on") if ft_on else "ft-off", records, elapsed, cpu_s=cpu)


def _drop_namespace(cfg: FTConfig) -> None:
    client = client_for(cfg.redis_url, cfg.connect_timeout_s)
    keys = list(client.scan_iter(match=f"{cfg.namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


def run_plain(spark: Any, records: int) -> Run:
    """No ftlayer: rate-micro-batch rows with the same columns, the same operations and write."""
    from pyspark.sql import functions as F

    counter = _Counter()
    src = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 50_000).load()
           .select(F.col("value").alias("i"),
                   F.concat(F.lit("user-"), (F.col("value") % USERS).cast("string")).alias("user"),
                   F.concat(F.lit("/p/"), (F.col("value") % 13).cast("string")).alias("page")))
    watch = Stopwatch()
    query = _ops(src).writeStream.foreachBatch(counter).trigger(processingTime="100 milliseconds").start()
    try:
        run_until(query, lambda: sum(int(p["numInputRows"]) for p in query.recentProgress) >= records)
        elapsed, cpu = watch.read()
        done = sum(int(p["numInputRows"]) for p in query.recentProgress)
    finally:
        stop_query(query, BENCH_STOP_GRACE_S)
    return Run("plain", done, elapsed, cpu_s=cpu)


def run_python_source(spark: Any, records: int) -> Run:
    """No ftlayer, but a Python data source (:mod:`runtime.bench.python_source`): the same columns,
    operations and write as ``plain``, read through PySpark's Python source machinery."""
    from runtime.bench.python_source import NAME, register

    register(spark)
    counter = _Counter()
    src = spark.readStream.format(NAME).option("records", str(records)).load()
    kept = sum(1 for i in range(records) if i % 10 != 3)
    watch = Stopwatch()
    query = _ops(src).writeStream.foreachBatch(counter).trigger(processingTime="100 milliseconds").start()
    try:
        run_until(query, lambda: counter.rows >= kept)
        elapsed, cpu = watch.read()
    finally:
        stop_query(query, BENCH_STOP_GRACE_S)
    return Run("python-source", records, elapsed, cpu_s=cpu)


def bench_e2e_dataframe(spark: Any, config: FTConfig, records: int, repeats: int, *,
                        on_round: Any = None) -> dict[str, Any]:
    """Alternate ft-on, ft-off and plain ``repeats`` times (order rotated each round), after one
    uncounted warm-up round of each at the full ``records``; records/s per variant and the per-round ratios.

    The warm-up is full size because every variant (plain's ``rate-micro-batch`` job most, whose
    50,000-row batches a 20,000-record warm-up never reached) kept speeding up over its first
    measured rounds after a 20,000-record one, which made the first rounds' ratios depend on which
    variant had warmed less; each variant gets the same discarded round, so none is favoured."""
    variants: dict[str, Callable[[], Run]] = {
        "ft-on": lambda: run_dataframe(spark, config, records, ft_on=True),
        "ft-on-columnar": lambda: run_dataframe(spark, config, records, ft_on=True, columnar=True),
        "ft-off": lambda: run_dataframe(spark, config, records, ft_on=False),
        "plain": lambda: run_plain(spark, records),
        "python-source": lambda: run_python_source(spark, records),
    }
    warm = records
    run_dataframe(spark, config, warm, ft_on=True)
    run_dataframe(spark, config, warm, ft_on=True, columnar=True)
    run_dataframe(spark, config, warm, ft_on=False)
    run_plain(spark, warm)
    run_python_source(spark, warm)
    # the rotation of the Topology bench; no prime: this bench's Python workers are never killed
    # (its plain variant runs no Python in tasks, and every FT or Python-source query stops between batches)
    runs, _ = alternate(variants, repeats, prime=lambda: None, on_round=on_round)
    got = [{name: run.rate for name, run in r.items()} for r in runs]
    rates = {name: [g[name] for g in got] for name in variants}
    on_off = [g["ft-on"] / g["ft-off"] for g in got]
    on_plain = [g["ft-on"] / g["plain"] for g in got]
    columnar_plain = [g["ft-on-columnar"] / g["plain"] for g in got]
    on_python = [g["ft-on"] / g["python-source"] for g in got]
    python_plain = [g["python-source"] / g["plain"] for g in got]
    return {
        "records": records,
        "pipeline": "withColumn, filter (10 % out), repartition by user, withColumn, foreachBatch count",
        "records_per_s": {name: summary(v) for name, v in rates.items()},
        **cpu_per_record(runs),
        "ft_on_vs_off_ratio": summary(on_off),
        "ft_on_vs_plain_ratio": summary(on_plain),
        # the same, the records ingested with the query's schema: read from their chunks' columns
        "ft_on_columnar_vs_plain_ratio": summary(columnar_plain),
        # the reference (runtime.bench.python_source): what any Python source costs, and ftlayer's own part
        "python_source_vs_plain_ratio": summary(python_plain),
        "ft_on_vs_python_source_ratio": summary(on_python),
    }

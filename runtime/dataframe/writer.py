"""A per-task acking writer on PySpark's Python stream writer API: ``writeStream.format(ftlayer.acking_sink(...))``.

::

    def write_rows(rows):                     # runs in each write task, on the executors
        with open_connection() as db:         # any destination: files, a database, an HTTP API
            db.insert_many(r.asDict() for r in rows)

    fmt = ftlayer.acking_sink(spark, write_rows)          # or arrow=True: fn gets pyarrow RecordBatches
    query = df.writeStream.format(fmt).option("checkpointLocation", ck).start()

:func:`acking_sink` registers a :class:`pyspark.sql.datasource.DataSource` whose stream writer
(:class:`~pyspark.sql.datasource.DataSourceStreamWriter`, or the Arrow variant) calls ``fn`` once
per write task with that task's rows. The rules:

- **Acked at Spark's commit.** The writer acks nothing itself: once Spark has committed the
  micro-batch (every write task returned, the writer's ``commit`` ran and the commit log entry
  is written), the FT source acks every record the batch emitted that is still pending
  (``runtime.spark.typed_source``). So a record whose rows sit in several write tasks (explode,
  a shuffle) is acked after all of them were written, records whose rows were all filtered out
  or folded into aggregation state are acked then too, and a batch that fails before its commit
  log entry is re-run by Spark and reads its records again.
- **A failed write is retried in the task**, with backoff, for up to ``sink_retry_budget_s``
  (``runtime.dataframe.sink_retry``): the task keeps its rows in memory for that (bound them with
  ``max_records_per_batch``), its batch holds its records from timing out, and the sources' sink
  breaker keeps replays paused. A sink outage shorter than the budget costs no replay.
- **A write that still fails** does not fail the Spark task: the task reports its records (the
  ``_ftlayer`` column) to ``commit``, which then, for a stateless plan, fails exactly those
  (replayed under new ids with backoff, then dead-lettered after ``max_replays``) and lets the
  batch commit: the other records are acked. A record with rows in a failed task and in a
  successful one is failed: not all its rows were written. Without an ``_ftlayer`` column a
  failure fails every still-pending record of the batch. For a stateful plan (or one not known
  to be stateless yet: ``stateful=None`` learns it from the query's progress reports,
  ``runtime.dataframe.commits``) ``commit`` raises instead: Spark does not commit the batch and
  the query stops; restarted on its checkpoint it re-runs the batch, so state counts each
  record once.
- **A task that dies** (its Python worker or executor killed) is retried by Spark; only its last
  attempt's message reaches ``commit``. If Spark gives up, ``abort`` fails every still-pending
  record of the batch and the query stops with Spark's error (restart it on its checkpoint).
- **Rows of a record a row function failed** (``ftlayer.udf``) still reach ``fn`` (with null in
  that column); the record was failed already and is replayed, not acked.

Effects are at-least-once: a replayed record's rows are written again, and a batch that Spark
re-runs after a driver restart calls ``fn`` again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, FTLayerError, SinkWriteError
from ftlayer.logs import logger_for
from runtime.dataframe.acking import batch_sources, settle_batch
from runtime.dataframe.plan import mark_writer, recall_stateful
from runtime.dataframe.rowfn import MAX_REASON_CHARS
from runtime.dataframe.session_state import config_or_last
from runtime.dataframe.sink_retry import SinkRetry, close_breakers
from runtime.spark.connect import is_connect
from runtime.spark.payload_columns import METADATA_COLUMN
from runtime.spark.typed_source import batch_identity

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

__all__ = ["TaskResult", "acking_sink"]

log = logger_for(__name__)


@dataclass
class TaskResult(WriterCommitMessage):
    """What one write task tells ``commit``: its query, and if ``fn`` raised, why and which records."""

    query_id: str
    rows: int = 0
    error: str = ""
    failed: dict[str, list[int]] = field(default_factory=dict)  # "topology/source" -> source record ids
    traced: bool = True  # False: no _ftlayer column, so a failure fails the whole batch


class _Tracer:
    """Counts the rows ``fn`` takes and remembers the source records they came from."""

    def __init__(self, meta_index: int | None, arrow: bool) -> None:
        self.meta_index = meta_index
        self.arrow = arrow
        self.rows = 0
        self.records: dict[str, set[int]] = {}

    def note(self, item: Any) -> None:
        if self.arrow:
            self.rows += item.num_rows
            if self.meta_index is not None:
                meta = item.column(self.meta_index)
                for sid, source in zip(meta.field("sid").to_pylist(), meta.field("source").to_pylist(), strict=True):
                    self.records.setdefault(source, set()).add(int(sid))
            return
        self.rows += 1
        if self.meta_index is not None:
            meta = item[self.meta_index]
            self.records.setdefault(meta["source"], set()).add(int(meta["sid"]))

    def traced(self, items: Iterator[Any]) -> Iterator[Any]:
        for item in items:
            self.note(item)
            yield item


class _Writer:
    """The write/commit/abort of both writer variants (mixed into the PySpark base classes)."""

    fn: Callable[[Iterator[Any]], Any]
    config: FTConfig
    arrow: bool

    def __init__(self, schema: StructType, fn: Callable[[Iterator[Any]], Any], config: FTConfig, arrow: bool,
                 stateful: bool | None = None) -> None:
        names = schema.fieldNames()
        self.meta_index = names.index(METADATA_COLUMN) if METADATA_COLUMN in names else None
        self.fn, self.config, self.arrow, self.stateful = fn, config, arrow, stateful

    def write(self, iterator: Iterator[Any]) -> TaskResult:
        from pyspark import TaskContext

        tracer = _Tracer(self.meta_index, self.arrow)
        rows = list(tracer.traced(iterator))  # kept: a failed write is retried on the same rows
        ctx = TaskContext.get()
        ident = batch_identity(ctx.getLocalProperty) if ctx is not None else None
        query_id = ident[0] if ident is not None else ""
        cfg = self.config

        def sources() -> list[str]:
            if tracer.records:
                return sorted(tracer.records)
            return batch_sources(cfg, *ident) if ident is not None else []

        part = ctx.partitionId() if ctx is not None else "?"
        retry = SinkRetry(cfg, query_id, sources, what=f"write task {part} of batch "
                          f"{ident[1] if ident is not None else '?'}")
        error = retry.run(lambda: self.fn(iter(rows)))
        if error is None:
            return TaskResult(query_id, tracer.rows)
        reason = f"write failed: {type(error).__name__}: {error}"[:MAX_REASON_CHARS]
        log.warning("ftlayer sink: a write task failed after %d attempts (%s)", retry.attempts, reason)
        failed = {src: sorted(ids) for src, ids in tracer.records.items()}
        return TaskResult(query_id, tracer.rows, reason, failed, traced=self.meta_index is not None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        results = [m for m in messages if isinstance(m, TaskResult)]
        query_id = next((r.query_id for r in results if r.query_id), "")
        if not query_id:
            log.error("ftlayer sink: batch %d carries no streaming query id; its records time out and replay",
                      batchId)
            return
        if self.stateful is None:
            try:  # so the commit listener says whether the query keeps state
                mark_writer(self.config, query_id, batchId)
            except Exception as exc:  # without it a failed write is handled as for a stateful plan
                log.warning("ftlayer sink: could not note batch %d of query %s: %s", batchId, query_id, exc)
        failures = [r for r in results if r.error]
        if not failures:
            close_breakers(self.config, batch_sources(self.config, query_id, batchId))
            return  # acked once Spark committed the batch (the FT source settles it)
        if not self._stateless(query_id):
            msg = (f"ftlayer sink: {len(failures)} write task(s) of batch {batchId} failed ({failures[0].error}); "
                   "the plan keeps state (or is not known not to), so the batch is not committed: restart the "
                   "query on its checkpoint to re-run it")
            raise SinkWriteError(msg)
        whole = next((r.error for r in failures if not r.traced), "")
        if whole:
            settle_batch(self.config, query_id, batchId, "fail", whole)
            return
        _fail_traced(self.config, failures)

    def _stateless(self, query_id: str) -> bool:
        if self.stateful is not None:
            return not self.stateful
        return recall_stateful(self.config, query_id) is False

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        results = [m for m in messages if isinstance(m, TaskResult)]
        query_id = next((r.query_id for r in results if r.query_id), "")
        if not query_id:
            return  # nothing to go by: the records time out and replay
        try:
            settle_batch(self.config, query_id, batchId, "fail", f"batch {batchId} write aborted by Spark")
        except FTLayerError:
            log.exception("ftlayer sink: could not fail batch %d of query %s", batchId, query_id)


def _fail_traced(config: FTConfig, results: list[TaskResult]) -> None:
    from ftlayer.facade.ft_layer import FTLayer

    for r in results:
        for source, sids in r.failed.items():
            topology, _, name = source.partition("/")
            FTLayer(config, topology, name, outage_budget_s=config.outage_budget_s).fail(sids, r.error)


class _RowWriter(_Writer, DataSourceStreamWriter):
    pass


def _arrow_writer() -> type[_Writer]:
    """The Arrow variant (pyspark >= 4.1 has DataSourceStreamArrowWriter); ConfigError before."""
    try:
        from pyspark.sql.datasource import DataSourceStreamArrowWriter
    except ImportError as exc:
        msg = "acking_sink(arrow=True) needs pyspark >= 4.1 (DataSourceStreamArrowWriter); use arrow=False"
        raise ConfigError(msg) from exc

    class _ArrowWriter(_Writer, DataSourceStreamArrowWriter):
        pass

    return _ArrowWriter


def acking_sink(spark: SparkSession, fn: Callable[[Iterator[Any]], Any], *, name: str | None = None,
                arrow: bool = False, config: FTConfig | None = None, stateful: bool | None = None) -> str:
    """Register a per-task acking stream sink that writes with ``fn``; returns its format name.

    ``fn(rows)`` is called once per write task with an iterator of :class:`pyspark.sql.Row`
    (``arrow=True``: of ``pyarrow.RecordBatch``); it must be picklable (closures are fine). The
    format name is ``name`` or ``ftlayer-sink-<fn's name>``. Call it on the thread that starts
    the query: on a classic session it also makes ``spark`` the JVM's active session there, where
    Spark looks the format up (a Spark Connect server does that itself). See the module notes for
    when records are acked. ``config`` defaults to the
    last ftlayer source opened in this process. ``stateful`` says whether the query keeps state
    (None: learnt from its progress reports); it decides what a write that still fails after its
    retries does (module notes).
    """
    cfg = config_or_last(config)
    fmt = name or f"ftlayer-sink-{getattr(fn, '__name__', 'fn')}"
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", fmt):
        msg = f"acking_sink(name={fmt!r}): use letters, digits, '_', '.' and '-'"
        raise ConfigError(msg)
    writer_cls: Any = _arrow_writer() if arrow else _RowWriter

    class _Sink(DataSource):
        @classmethod
        def name(cls) -> str:
            return fmt

        def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
            writer: DataSourceStreamWriter = writer_cls(schema, fn, cfg, arrow, stateful)
            return writer

    spark.dataSource.register(_Sink)
    if not is_connect(spark):  # a Connect server runs each request with its session active
        # Spark looks a streaming sink's format up in the JVM thread's *active* session, which a py4j
        # thread may not have (DATA_SOURCE_NOT_FOUND although registered): make it this session.
        jvm: Any = spark._jvm
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    return fmt

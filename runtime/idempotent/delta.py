"""Effectively-once writes to a Delta table: rows merged on their lineage id, through delta-rs.

A row's lineage id (``ftlayer.records.lineage``) is the same on every attempt of its source record. Each
write is one Delta ``MERGE ... ON t.<key> = s.<key> WHEN NOT MATCHED THEN INSERT *``, a single
atomic commit: a replay, a Spark task retry, an in-place retry of a failed ``foreachBatch`` and
a re-run of an uncommitted batch after a restart all find their rows already in the table and
insert nothing. Three entry points:

- :class:`DeltaWriter`: the core. ``write(batch)`` merges one Arrow batch, returns rows inserted.
- :func:`delta_sink`: a ``foreachBatch`` function for the DataFrame path,
  ``df.writeStream.foreachBatch(ftlayer.acking(ftlayer.delta_sink("/data/clicks")))``.
- :class:`DeltaSink`: an :class:`~runtime.sinks.ExecutorSink` for the Topology path, keyed by
  ``SinkContext.lineages``.

Contract and bounds:

- **First write wins.** A row whose key is in the table already is dropped, not updated (a
  replay that computes another value for the same id does not change the table); of several rows
  with one key in a batch the first is inserted. A null key is refused (it would never match).
- **Conflicts.** A merge reads the whole table, so a concurrent commit that added files makes
  delta-rs refuse it (``CommitFailedError``: "a concurrent transaction added new data"); the
  merge is then re-run on a fresh snapshot, up to ``max_attempts`` times with jittered backoff,
  then :class:`DeltaConflictError`. Concurrent writers therefore commit one at a time. The check
  relies on the table's default isolation (``delta.isolationLevel`` = ``Serializable``); with
  ``SnapshotIsolation`` two racing merges can both insert a key.
- **Creation.** The first write creates the table (``write_deltalake``, ``mode="error"``) with
  the batch's schema; a writer that loses the race to create it merges into the winner's table.
- **Schema.** Later batches are merged by column name: a column the table does not have is
  dropped (delta-rs' ``insert_all``), a missing one is null. Evolve the table yourself.
- **Batch idempotency** (like Spark's ``txnAppId``/``txnVersion``): ``write(batch, txn=(app_id,
  version))`` records ``(app_id, version)`` in the merge's commit (a Delta ``txn`` action,
  delta-rs ``CommitProperties(app_transactions=...)``), and a later write with a version <= the
  recorded one is skipped without merging. A merge that inserts nothing commits nothing, so
  its version is not recorded: a re-run of such a batch merges again (and inserts nothing).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ftlayer.errors import FTLayerError
from ftlayer.logs import logger_for
from runtime.idempotent.extras import import_extra
from runtime.idempotent.keyed import DEFAULT_KEY, DEFAULT_LINEAGE, keyed_rows
from runtime.sinks import ExecutorSink, SinkContext

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

__all__ = ["DeltaConflictError", "DeltaSink", "DeltaSinkError", "DeltaWriter", "delta_sink", "import_deltalake"]

log = logger_for(__name__)


class DeltaSinkError(FTLayerError):
    """A Delta sink could not write a batch (nothing of it was committed), or is misconfigured."""


class DeltaConflictError(DeltaSinkError):
    """A merge kept losing to concurrent commits for ``max_attempts`` attempts; nothing was committed."""


def import_deltalake() -> ModuleType:
    """deltalake (delta-rs), or a clear error saying which extra to install."""
    return import_extra("deltalake", "the Delta sink needs the deltalake package (delta-rs)", "delta", DeltaSinkError)


class DeltaWriter:
    """Merges Arrow batches into the Delta table at ``table_uri``, each row once per ``key``.

    Picklable (the loaded table is dropped and reloaded on first use). One instance may be used
    by one thread at a time; several instances, threads or processes may write one table at once
    (see the module notes on conflicts).
    """

    def __init__(self, table_uri: str, *, key: str = DEFAULT_KEY, storage_options: Mapping[str, str] | None = None,
                 max_attempts: int = 16, backoff_s: float = 0.05, max_backoff_s: float = 2.0) -> None:
        import_deltalake()  # fail at construction, not in the first batch
        if max_attempts < 1:
            msg = f"DeltaWriter(max_attempts={max_attempts}): expected >= 1"
            raise DeltaSinkError(msg)
        self.table_uri, self.key = table_uri, key
        self.storage_options = dict(storage_options) if storage_options is not None else None
        self.max_attempts, self.backoff_s, self.max_backoff_s = max_attempts, backoff_s, max_backoff_s
        self._table: DeltaTable | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_table"] = None  # a DeltaTable handle is a Rust object: reload it where unpickled
        return state

    def write(self, batch: pa.Table | pa.RecordBatch, *, txn: tuple[str, int] | None = None) -> int:
        """Merge ``batch`` in one commit; return the rows inserted (0 for a skipped ``txn``).

        Raises :class:`DeltaConflictError` after ``max_attempts`` conflicting attempts and
        :class:`DeltaSinkError` for any other failure; in both cases nothing of ``batch`` was
        committed by this call, and calling again is safe.
        """
        import pyarrow as pa

        deltalake = import_deltalake()
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        table = self._deduped(table)
        if table.num_rows == 0:
            return 0
        error: Exception | None = None
        for attempt in range(self.max_attempts):
            if attempt:
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * random.uniform(0.5, 1.5))  # jitter: racing writers spread out
            try:
                return self._write_once(table, txn)
            except deltalake.exceptions.CommitFailedError as exc:
                error = exc
                self._table = None  # reload: our snapshot missed the commit we lost to
            except deltalake.exceptions.DeltaError as exc:
                msg = f"Delta write of {table.num_rows} rows to {self.table_uri} failed: {exc}"
                raise DeltaSinkError(msg) from exc
        msg = (f"Delta merge of {table.num_rows} rows into {self.table_uri} lost to concurrent commits "
               f"{self.max_attempts} times; nothing was committed: {error}")
        raise DeltaConflictError(msg) from error

    def _write_once(self, table: pa.Table, txn: tuple[str, int] | None) -> int:
        deltalake = import_deltalake()
        txns = [deltalake.Transaction(*txn)] if txn else None
        dt = self._load()
        if dt is None:
            # no commit retries: delta-rs would re-commit a create that lost the race for version 0
            # as an append of the same rows at version 1 (seen: duplicates); failing, it merges below
            create = deltalake.CommitProperties(max_commit_retries=0, app_transactions=txns)
            try:
                deltalake.write_deltalake(self.table_uri, table, mode="error", storage_options=self.storage_options,
                                          commit_properties=create)
            except deltalake.exceptions.DeltaError:
                dt = self._load()
                if dt is None:  # not a lost race: the create itself failed
                    raise
            else:
                return int(table.num_rows)
        if txn is not None:
            done = dt.transaction_version(txn[0])
            if done is not None and done >= txn[1]:
                return 0  # this batch version already committed: skip without merging
        metrics = (dt.merge(table, predicate=f"t.`{self.key}` = s.`{self.key}`", source_alias="s",
                            target_alias="t", commit_properties=deltalake.CommitProperties(app_transactions=txns))
                   .when_not_matched_insert_all().execute())
        return int(metrics["num_target_rows_inserted"])

    def _load(self) -> DeltaTable | None:
        """The table at its latest version, or None if there is none yet."""
        deltalake = import_deltalake()
        if self._table is not None:
            self._table.update_incremental()  # fewer conflicts: merge on the newest snapshot
            return self._table
        if not deltalake.DeltaTable.is_deltatable(self.table_uri, storage_options=self.storage_options):
            return None
        self._table = deltalake.DeltaTable(self.table_uri, storage_options=self.storage_options)
        return self._table

    def _deduped(self, table: pa.Table) -> pa.Table:
        """``table`` with the first row of each key only (a merge would insert every duplicate)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.key not in table.column_names:
            msg = f"Delta write to {self.table_uri}: the batch has no key column {self.key!r} ({table.column_names})"
            raise DeltaSinkError(msg)
        keys = table.column(self.key)
        if keys.null_count:
            msg = f"Delta write to {self.table_uri}: {keys.null_count} rows have a null {self.key!r}"
            raise DeltaSinkError(msg)
        if pc.count_distinct(keys).as_py() == table.num_rows:
            return table
        rows = table.select([self.key]).append_column("__row", pa.array(np.arange(table.num_rows)))
        firsts = rows.group_by(self.key, use_threads=False).aggregate([("__row", "min")]).column("__row_min")
        return table.take(np.sort(firsts.to_numpy()))


def delta_sink(table_uri: str, *, key: str = DEFAULT_KEY, lineage: str = DEFAULT_LINEAGE,
               columns: Sequence[str] | None = None, app_id: str | None = None,
               storage_options: Mapping[str, str] | None = None) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function merging each micro-batch into ``table_uri`` on its lineage id.

    ``df.writeStream.foreachBatch(ftlayer.acking(ftlayer.delta_sink("/data/clicks")))``. The rows
    get the user's columns (``columns``, default all but the struct named by ``lineage``) plus
    ``key`` from ``lineage``. **Bound:** the batch is collected to the driver as Arrow
    (``df.toArrow()``) and merged in one commit there, so a batch must fit in the driver's
    memory (cap it with the source's ``max_records_per_batch``); the driver is the only writer,
    so its tasks cannot conflict with each other. With ``app_id`` the batch id is the Delta txn
    version, under the app id ``"<app_id>/<streaming query id>"`` (the query id is kept in the
    checkpoint, so a new checkpoint, which counts batches from 0 again, is never skipped): a
    batch re-run after a restart that already committed is skipped without a merge. Skipping is
    safe because a re-run batch reads a subset of its first run's records (``runtime.spark.ft_source``).
    On Spark Connect the query id is the one ``ftlayer.acking`` found for the batch
    (``runtime.dataframe.batch_context``); when it could not tell it, the batch is merged
    without a txn id (idempotent on the lineage ids, only not skipped).

    With delta-spark (the JVM Delta, not available to these tests) the same is a merge run by
    Spark itself, without the collect; the target table must exist::

        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        def upsert(df, batch_id):
            batch = (df.withColumn("lineage_id", F.col("_ftlayer.lineage")).drop("_ftlayer")
                     .dropDuplicates(["lineage_id"]))  # MERGE would insert every duplicate
            (DeltaTable.forPath(df.sparkSession, "/data/clicks").alias("t")
             .merge(batch.alias("s"), "t.lineage_id = s.lineage_id")
             .whenNotMatchedInsertAll().execute())

        df.writeStream.foreachBatch(ftlayer.acking(upsert)).start()
    """
    writer = DeltaWriter(table_uri, key=key, storage_options=storage_options)

    def write_batch(df: DataFrame, batch_id: int) -> None:
        from runtime.dataframe.batch_context import current_query_id
        from runtime.spark.connect import is_connect

        selected = keyed_rows(df, f"delta_sink({table_uri!r})", key=key, lineage=lineage, columns=columns)
        rows = selected.toArrow()
        txn = None
        if app_id is not None:
            query_id = current_query_id(df)
            if query_id is None and is_connect(df):  # a new checkpoint's batch 0 must not be skipped
                log.warning("delta_sink(app_id=%r): the query id of batch %d is not known on this Spark Connect "
                            "session; merging without a txn id (idempotent, just not skipped)", app_id, batch_id)
            else:
                txn = (f"{app_id}/{query_id}" if query_id else app_id, batch_id)
        writer.write(rows, txn=txn)

    return write_batch


class DeltaSink(ExecutorSink):
    """Topology sink: each task merges its batch of dict values, keyed by ``ctx.lineages``.

    ``schema`` (a ``pyarrow.Schema`` of the value columns) fixes the column types; without it
    they are inferred per batch (a batch whose column is all null infers type null). Several
    tasks merge at once: they conflict and are retried (module notes). A write that still fails
    raises, so the batch's records fail and are replayed; the replays merge idempotently.
    """

    def __init__(self, table_uri: str, *, key: str = DEFAULT_KEY, schema: pa.Schema | None = None,
                 storage_options: Mapping[str, str] | None = None, max_attempts: int = 16) -> None:
        self.writer = DeltaWriter(table_uri, key=key, storage_options=storage_options, max_attempts=max_attempts)
        self.schema = schema

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        import pyarrow as pa

        if not values:
            return
        key, uri = self.writer.key, self.writer.table_uri
        if len(ctx.lineages) != len(values):
            msg = f"DeltaSink({uri!r}): {len(values)} values but {len(ctx.lineages)} lineage ids"
            raise DeltaSinkError(msg)
        bad = next((v for v in values if not isinstance(v, Mapping)), None)
        if bad is not None:
            msg = f"DeltaSink({uri!r}) writes dict values (column -> value), got {type(bad).__name__}: {bad!r:.80}"
            raise DeltaSinkError(msg)
        table = pa.Table.from_pylist(values, schema=self.schema)
        if key in table.column_names:
            msg = f"DeltaSink({uri!r}): the values already have a field {key!r}; pass another key="
            raise DeltaSinkError(msg)
        self.writer.write(table.append_column(key, pa.array(ctx.lineages, pa.string())))

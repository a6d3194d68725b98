"""Effectively-once writes to PostgreSQL: each row under its lineage id, ``ON CONFLICT DO NOTHING``.

A row's lineage id (``ftlayer.records.lineage``) is the same on every attempt of its source record, so
writing it into a column with a unique constraint makes a replay, a Spark task retry, an in-place
retry of a failed ``foreachBatch`` and a re-run of an uncommitted batch after a restart all land
on the row already there: the table shows each output once. Three entry points:

- :class:`PostgresWriter`: the core. ``write(rows)`` writes one batch in one transaction and
  returns how many rows were new.
- :func:`postgres_sink`: a ``foreachBatch`` function for the DataFrame path,
  ``df.writeStream.foreachBatch(ftlayer.acking(ftlayer.postgres_sink(url, "clicks")))``; every
  Spark partition is written inside its executor, one transaction per partition.
- :class:`PostgresSink`: an :class:`~runtime.sinks.ExecutorSink` for the Topology path, keyed by
  ``SinkContext.lineages``.

What this does not give: the *first* write of a row wins. A replay that computes a different
value for the same lineage id (a non-deterministic function, a changed lookup) is dropped, not
updated. psycopg 3 is imported only when a writer connects (``pip install 'ftlayer[postgres]'``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ftlayer.errors import FTLayerError
from ftlayer.logs import logger_for
from runtime.idempotent.extras import import_extra
from runtime.idempotent.keyed import DEFAULT_KEY, DEFAULT_LINEAGE, keyed_rows
from runtime.sinks import ExecutorSink, SinkContext

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame

__all__ = [
    "PostgresSink",
    "PostgresSinkError",
    "PostgresWriter",
    "UniqueKeyMissingError",
    "import_psycopg",
    "postgres_sink",
]

log = logger_for(__name__)



class PostgresSinkError(FTLayerError):
    """A Postgres sink could not write a batch (nothing of it was committed), or is misconfigured."""


class UniqueKeyMissingError(PostgresSinkError):
    """The target table has no unique constraint on the key column, so a replay could be written twice."""


def import_psycopg() -> ModuleType:
    """psycopg 3, or a clear error saying which extra to install."""
    return import_extra("psycopg", "the Postgres sink needs psycopg 3", "postgres", PostgresSinkError)


def _table_identifier(table: str) -> Any:
    """``"name"`` or ``"schema.name"`` (split at the first dot) as a quoted psycopg identifier."""
    from psycopg import sql

    schema, dot, name = table.partition(".")
    return sql.Identifier(schema, name) if dot else sql.Identifier(table)


class PostgresWriter:
    """Writes batches of rows to ``table``, each row once per value of its ``key`` column.

    Contract:

    - ``write(rows)`` runs in **one transaction**: either every new row of the batch is
      committed, or (an error: a value of the wrong type, a constraint, a lost connection)
      none is, and the error is raised as :class:`PostgresSinkError`. The one unknown outcome,
      a connection lost during the COMMIT itself, is harmless: writing the batch again is safe.
    - **Idempotent**: a row whose key is already in the table is skipped (``INSERT ... ON
      CONFLICT (key) DO NOTHING``), so writing the same batch again inserts nothing and returns
      0. Two rows with the same key in one batch insert once (the first one).
    - The first write checks that ``key`` has a unique, non-deferrable index of its own (a
      primary key or unique constraint); without one it raises :class:`UniqueKeyMissingError`
      rather than risk writing a replay twice.
    - One connection per writer, opened at the first write. A dropped connection (server
      restart, ``pg_terminate_backend``, network) is reopened and the batch retried once: safe
      because the write is idempotent, even when the lost attempt did commit (its rows are then
      counted as duplicates by the retry).
    - Columns are the union of the rows' keys; a row missing one writes NULL there. A ``dict``
      value is sent as ``jsonb``.

    ``table`` is a name, or ``schema.name`` (split at the first dot); every identifier is quoted.
    ``create`` lets :meth:`ensure_table` create a missing table (False: it only checks it).
    """

    def __init__(self, conninfo: str, table: str, *, key: str = DEFAULT_KEY, create: bool = True,
                 connect_timeout_s: float = 10.0) -> None:
        self.conninfo = conninfo
        self.table = table
        self.key = key
        self.create = create
        self.connect_timeout_s = connect_timeout_s
        self._conn: psycopg.Connection[Any] | None = None
        self._checked = False
        self._stages: set[tuple[str, ...]] = set()

    def __getstate__(self) -> dict[str, Any]:  # a connection does not travel: the copy reconnects
        state = self.__dict__.copy()
        state.update(_conn=None, _stages=set())
        return state

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            psycopg = import_psycopg()
            try:
                self._conn = psycopg.connect(self.conninfo, autocommit=True,
                                             connect_timeout=max(1, round(self.connect_timeout_s)))
            except psycopg.OperationalError as exc:
                msg = f"cannot connect to PostgreSQL for table {self.table!r}: {exc}"
                raise PostgresSinkError(msg) from exc
            self._stages = set()  # temporary tables die with their session
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def ensure_table(self, columns: Mapping[str, str]) -> None:
        """Create ``table (key text PRIMARY KEY, <name> <type>, ...)`` if it does not exist, then
        check it has a unique key on ``key`` (:class:`UniqueKeyMissingError` otherwise).

        ``columns`` maps column names (quoted here) to SQL types such as ``"bigint"`` or
        ``"timestamptz NOT NULL"`` (trusted SQL, inserted as written). With ``create=False`` a
        missing table is an error instead.
        """
        from psycopg import sql

        conn = self._connection()
        if self.create:
            parts = [sql.SQL("{} text PRIMARY KEY").format(sql.Identifier(self.key))]
            parts += [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
                      for name, kind in columns.items() if name != self.key]
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                _table_identifier(self.table), sql.SQL(", ").join(parts)))
        self._check_unique_key(conn)

    def _check_unique_key(self, conn: psycopg.Connection[Any]) -> None:
        from psycopg import sql

        name = _table_identifier(self.table).as_string(conn)
        row = conn.execute("SELECT to_regclass(%s)::oid", (name,)).fetchone()
        if row is None or row[0] is None:
            msg = (f"table {self.table!r} does not exist: create it with a unique key on {self.key!r} "
                   f"(or call PostgresWriter.ensure_table)")
            raise PostgresSinkError(msg)
        # ON CONFLICT (key) needs an index on exactly that column, unique, not partial, not
        # deferrable (PostgreSQL cannot use a deferrable one as an arbiter)
        unique = conn.execute(sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a "
            "ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
            "WHERE i.indrelid = %s AND i.indisunique AND i.indimmediate AND i.indnkeyatts = 1 "
            "AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = %s)"), (row[0], self.key)).fetchone()
        if not (unique and unique[0]):
            msg = (f"table {self.table!r} has no unique constraint on column {self.key!r}: the effectively-once "
                   f"sink needs one (ALTER TABLE ... ADD PRIMARY KEY ({self.key})), or a replayed record could "
                   f"be written twice")
            raise UniqueKeyMissingError(msg)
        self._checked = True

    def write(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Write ``rows`` in one transaction; return how many were inserted (the rest were already there)."""
        psycopg = import_psycopg()
        unique = _dedupe(rows, self.key, self.table)
        if not unique:
            return 0
        columns = _columns(unique)
        try:
            return self._attempt(columns, unique)
        except psycopg.OperationalError as exc:
            if self._conn is not None and not (self._conn.broken or self._conn.closed):
                raise self._failed(unique, exc) from exc
            # the connection was lost: retry once on a new one (idempotent, so safe even if it committed)
            log.warning("connection to PostgreSQL lost while writing to %r (%s); reconnecting", self.table, exc)
            self.close()
        except psycopg.Error as exc:
            raise self._failed(unique, exc) from exc
        try:
            return self._attempt(columns, unique)
        except psycopg.Error as exc:
            raise self._failed(unique, exc) from exc

    def _attempt(self, columns: tuple[str, ...], rows: list[Mapping[str, Any]]) -> int:
        conn = self._connection()
        if not self._checked:
            self._check_unique_key(conn)
        return self._write_copy(conn, columns, rows)

    def _failed(self, rows: list[Mapping[str, Any]], exc: Exception) -> PostgresSinkError:
        return self._failed_n(len(rows), exc)

    def _write_copy(self, conn: psycopg.Connection[Any], columns: tuple[str, ...],
                    rows: list[Mapping[str, Any]]) -> int:
        """COPY into a temporary stage table of the batch's columns, then one INSERT ... SELECT.

        Measured against ``executemany`` of one INSERT ... ON CONFLICT per row (pipelined by
        psycopg) on 10k rows: about twice as fast for new rows, two to three times for duplicates.
        """
        from psycopg import sql

        target, cols, stage = self._stage(columns)
        with conn.transaction(), conn.cursor() as cur:
            self._create_stage(cur, columns, stage, cols, target)
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(stage, cols)) as copy:
                for row in rows:
                    copy.write_row([_adapt(row.get(c)) for c in columns])
            # in key order: see _dedupe
            cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY {} ON CONFLICT ({}) DO NOTHING").format(
                target, cols, cols, stage, sql.Identifier(self.key), sql.Identifier(self.key)))
            inserted = cur.rowcount
        self._stages.add(columns)  # only once committed: a rolled-back CREATE left no stage
        return max(inserted, 0)


    def write_arrow(self, table: Any) -> int:
        """Write a ``pyarrow.Table`` as :meth:`write` does (one transaction, idempotent, the first
        row of a key wins), with no Python per row: the table goes to the stage as CSV made by
        Arrow, and the INSERT keeps the first row of each key (``DISTINCT ON``, stage order).
        Only for tables of :func:`csv_ready` columns; others go through :meth:`write`."""
        psycopg = import_psycopg()
        if table.num_rows == 0:
            return 0
        if self.key not in table.column_names:
            msg = f"rows for {self.table!r} have no {self.key!r} column (their lineage id)"
            raise PostgresSinkError(msg)
        if table.column(self.key).null_count:
            msg = f"{table.column(self.key).null_count} rows for {self.table!r} have no {self.key!r} (lineage id)"
            raise PostgresSinkError(msg)
        columns = tuple(table.column_names)
        data = csv_bytes(table)
        try:
            return self._attempt_csv(columns, data)
        except psycopg.OperationalError as exc:
            if self._conn is not None and not (self._conn.broken or self._conn.closed):
                raise self._failed_n(table.num_rows, exc) from exc
            log.warning("connection to PostgreSQL lost while writing to %r (%s); reconnecting", self.table, exc)
            self.close()
        except psycopg.Error as exc:
            raise self._failed_n(table.num_rows, exc) from exc
        try:
            return self._attempt_csv(columns, data)
        except psycopg.Error as exc:
            raise self._failed_n(table.num_rows, exc) from exc

    def _failed_n(self, n: int, exc: Exception) -> PostgresSinkError:
        msg = (f"writing {n} rows to {self.table!r} failed: {exc} (the transaction rolled back, unless "
               f"the connection was lost during its commit; writing the batch again is safe either way)")
        return PostgresSinkError(msg)

    def _attempt_csv(self, columns: tuple[str, ...], data: bytes) -> int:
        from psycopg import sql

        conn = self._connection()
        if not self._checked:
            self._check_unique_key(conn)
        target, cols, stage = self._stage(columns)
        key = sql.Identifier(self.key)
        with conn.transaction(), conn.cursor() as cur:
            self._create_stage(cur, columns, stage, cols, target)
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(stage, cols)) as copy:
                copy.write(data)
            # the first row of each key, in key order (see _dedupe); ctid: the stage's COPY order
            cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, ctid "
                                "ON CONFLICT ({}) DO NOTHING").format(target, cols, key, cols, stage, key, key))
            inserted = cur.rowcount
        self._stages.add(columns)
        return max(inserted, 0)

    def _stage(self, columns: tuple[str, ...]) -> tuple[Any, Any, Any]:
        from psycopg import sql

        digest = hashlib.sha1(repr((self.table, columns)).encode()).hexdigest()[:16]
        return (_table_identifier(self.table), sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.Identifier(f"ftlayer_stage_{digest}"))

    def _create_stage(self, cur: Any, columns: tuple[str, ...], stage: Any, cols: Any, target: Any) -> None:
        from psycopg import sql

        if columns not in self._stages:
            # the stage takes the target's column types; ON COMMIT DELETE ROWS empties it per batch
            cur.execute(sql.SQL("CREATE TEMPORARY TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS AS "
                                "SELECT {} FROM {} WITH NO DATA").format(stage, cols, target))


def csv_ready(schema: Any) -> bool:
    """True if every column of the Arrow ``schema`` goes through CSV into PostgreSQL as it is:
    integers, floats, booleans and strings (Arrow quotes every string, so an empty string stays
    one and an unquoted empty field is NULL, as COPY's CSV format reads them)."""
    import pyarrow.types as pt

    return all(pt.is_integer(f.type) or pt.is_floating(f.type) or pt.is_boolean(f.type)
               or pt.is_string(f.type) or pt.is_large_string(f.type) for f in schema)


def csv_bytes(table: Any) -> bytes:
    """The rows of a ``pyarrow.Table`` of :func:`csv_ready` columns as CSV for ``COPY ... (FORMAT csv)``."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    sink = pa.BufferOutputStream()
    pcsv.write_csv(table, sink, pcsv.WriteOptions(include_header=False))
    return bytes(sink.getvalue())


def _dedupe(rows: Sequence[Mapping[str, Any]], key: str, table: str) -> list[Mapping[str, Any]]:
    """The first row of each key (a key twice in one batch is one output, written once).

    The INSERT then goes in key order (the table's collation): two transactions inserting
    overlapping keys (a replay written while its first attempt's write is still open) each wait
    on the other's uncommitted keys, and in opposite orders they deadlock (seen in the tests);
    in one global order the later one waits, then ON CONFLICT skips the keys.
    """
    first: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        lineage = row.get(key)
        if lineage is None:
            msg = f"a row for {table!r} has no {key!r} (its lineage id): {dict(row)!r:.200}"
            raise PostgresSinkError(msg)
        first.setdefault(str(lineage), row)
    return list(first.values())


def _columns(rows: list[Mapping[str, Any]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for row in rows:
        for name in row:
            seen.setdefault(name, None)
    return tuple(seen)


def _adapt(value: Any) -> Any:
    if isinstance(value, dict):
        from psycopg.types.json import Jsonb

        return Jsonb(value)
    return value


# One writer per (conninfo, table, key) and Python worker: Spark reuses its Python workers across
# tasks, so batches after the first reuse the connection instead of opening one per partition.
_WRITERS: dict[tuple[str, str, str], PostgresWriter] = {}


def _cached_writer(conninfo: str, table: str, key: str) -> PostgresWriter:
    writer = _WRITERS.get((conninfo, table, key))
    if writer is None:
        writer = _WRITERS[(conninfo, table, key)] = PostgresWriter(conninfo, table, key=key, create=False)
    return writer


def _write_partition(conninfo: str, table: str, key: str, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body, in the executor: the whole partition in one transaction; yields its counts."""
    import pyarrow as pa

    got = list(batches)
    n = sum(b.num_rows for b in got)
    writer = _cached_writer(conninfo, table, key)
    if not n:
        inserted = 0
    elif csv_ready(got[0].schema):  # no Python per row: Arrow writes the CSV that COPY reads
        inserted = writer.write_arrow(pa.Table.from_batches(got))
    else:  # nested or temporal columns: adapted value by value
        inserted = writer.write([row for b in got for row in b.to_pylist()])
    yield pa.RecordBatch.from_pydict({"rows": [n], "inserted": [inserted]})


@dataclass(frozen=True)
class _PostgresBatchSink:
    """The ``foreachBatch`` function :func:`postgres_sink` returns (a plain object: picklable)."""

    conninfo: str
    table: str
    key: str
    lineage: str
    columns: tuple[str, ...] | None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        selected = keyed_rows(df, f"postgres_sink({self.table!r})", key=self.key, lineage=self.lineage,
                              columns=self.columns)
        counts = selected.mapInArrow(partial(_write_partition, self.conninfo, self.table, self.key),
                                     "rows long, inserted long").collect()
        total, inserted = sum(r["rows"] for r in counts), sum(r["inserted"] for r in counts)
        log.info("batch %d: %d rows to %r, %d new, %d already there", batch_id, total, self.table,
                 inserted, total - inserted)


def postgres_sink(conninfo: str, table: str, *, key: str = DEFAULT_KEY, lineage: str = DEFAULT_LINEAGE,
                  columns: Sequence[str] | None = None) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to ``table`` effectively once.

    Wrap it in ``ftlayer.acking``. It writes the user's columns (``columns``, else all but the
    ``_ftlayer`` struct) plus ``key`` = the row's lineage id (``lineage``, a column path). Each
    Spark partition is written by its executor in one transaction with :class:`PostgresWriter`,
    so a re-run of the batch (acking's in-place retry, a Spark task retry, Spark re-running an
    uncommitted batch after a restart) inserts nothing twice. The table must exist with a unique
    key on ``key`` (see :meth:`PostgresWriter.ensure_table`). Rows made from one record (an
    ``explode``) share its lineage id and only the first is kept: add the position to it first.
    """
    return _PostgresBatchSink(conninfo, table, key, lineage, tuple(columns) if columns is not None else None)


class PostgresSink(ExecutorSink):
    """Topology sink: ``write(values, ctx)`` writes each value (a mapping) with ``key =
    ctx.lineages[i]``, one transaction per call, effectively once (see :class:`PostgresWriter`).
    Picklable: it connects at its first write, inside the executor."""

    def __init__(self, conninfo: str, table: str, *, key: str = DEFAULT_KEY) -> None:
        self.conninfo, self.table, self.key = conninfo, table, key
        self._writer: PostgresWriter | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_writer": None}

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        if len(ctx.lineages) != len(values):
            msg = f"PostgresSink: {len(values)} values but {len(ctx.lineages)} lineage ids in the sink context"
            raise PostgresSinkError(msg)
        rows: list[Mapping[str, Any]] = []
        for value, lineage in zip(values, ctx.lineages, strict=True):
            if not isinstance(value, Mapping):
                msg = f"PostgresSink writes mappings (column -> value), got {type(value).__name__}: {value!r:.200}"
                raise PostgresSinkError(msg)
            rows.append({**value, self.key: lineage})
        if self._writer is None:
            self._writer = PostgresWriter(self.conninfo, self.table, key=self.key, create=False)
        self._writer.write(rows)

"""FT-wrapped row functions: an exception in one row fails that row's source record, never the task.

- :func:`udf` ``(fn, returnType)`` gives a callable whose call on columns is a
  Spark UDF over ``_ftlayer.sid``, ``_ftlayer.source`` and those columns. A row
  where ``fn`` raises returns null and its source record fails at once (one
  flush call with the reason): it is replayed under a new id with backoff, then
  dead-lettered after ``max_replays``. The batch's acking point then skips it
  (no longer pending). The task never fails because of ``fn``. The null row
  still flows on; ``FTUdf.with_column(df, name, *cols)`` drops it instead, which
  is what an aggregate downstream needs (it counts the record once, when its
  replay succeeds).
- :func:`map_in_pandas` ``(df, fn, schema)`` runs ``fn(pandas.DataFrame) ->
  pandas.DataFrame`` on each Arrow batch of ``df`` (which must carry
  ``_ftlayer``). If ``fn`` raises, the batch is re-run one row at a time: rows
  that raise again fail their record (and produce no output), the other rows'
  outputs are kept. Cost: one extra pass per poisoned batch.

A failed row is never acked. Failing its record needs Redis; that call waits
out an outage (up to ``outage_budget_s``, as every Spark task of ftlayer does),
so a record is failed before its task ends even when the server restarts
meanwhile, and the batch's ack at Spark's commit skips it. If the server stays
away longer, the call raises :class:`~ftlayer.errors.RecordFailError` and fails
the Spark task: the batch cannot commit, so nothing of it is acked (Spark
retries the task, or the query stops and a restart re-runs the batch). The
config is the one given, else the last source opened in the driver process
(``runtime.dataframe.session_state.last_config``), captured when the UDF is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError, RecordFailError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.logs import logger_for
from runtime.dataframe.session_state import config_or_last
from runtime.spark.ddl import parse_schema
from runtime.spark.payload_columns import METADATA_COLUMN

if TYPE_CHECKING:
    import pandas as pd  # type: ignore[import-untyped]
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

__all__ = ["FTUdf", "fail_record", "map_in_pandas", "udf"]

log = logger_for(__name__)
MAX_REASON_CHARS = 1000
_layers: dict[tuple[str, str, str], FTLayer] = {}  # per executor process


def fail_record(config: FTConfig, source: str, sid: int, exc: BaseException, where: str) -> None:
    """Fail one source record (``source`` = ``topology/name``) for ``exc``, waiting out a Redis outage.

    Raises :class:`RecordFailError` (which fails the Spark task) if the record cannot be failed
    within ``outage_budget_s``: a row whose failure is not recorded must not let its batch commit.
    """
    key = (config.redis_url, config.namespace, source)
    layer = _layers.get(key)
    if layer is None:
        topology, _, name = source.partition("/")
        layer = _layers[key] = FTLayer(config, topology, name, outage_budget_s=config.outage_budget_s)
    reason = f"{where}: {type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]
    try:
        layer.xor({}, fails={int(sid): reason})
    except FTLayerError as err:
        msg = (f"record {sid} of {source} failed in {where} ({type(exc).__name__}: {exc}) and could not be "
               f"failed in Redis: {err}; failing the task so that its batch does not commit")
        raise RecordFailError(msg) from err


class FTUdf:
    """A row function as a Spark UDF whose exceptions fail the row's source record (see module notes)."""

    def __init__(self, fn: Callable[..., Any], return_type: DataType | str, config: FTConfig | None) -> None:
        from pyspark.sql import functions as F

        cfg = config_or_last(config)
        where = f"udf {getattr(fn, '__name__', 'fn')}"

        def guarded(sid: int, source: str, *args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as exc:  # one row's failure is its record's failure, not the task's
                fail_record(cfg, source, sid, exc, where)
                return None

        def checked(sid: int, source: str, *args: Any) -> tuple[bool, Any]:
            try:
                return True, fn(*args)
            except Exception as exc:
                fail_record(cfg, source, sid, exc, where)
                return False, None

        self.fn = fn
        # Spark infers a UDF's kind from its type hints when useArrow is not given; this wrapper's
        # hints are not for Spark (it warned "Cannot infer the eval type"): it is a plain row UDF.
        guarded.__annotations__ = {}
        checked.__annotations__ = {}
        self._udf = F.udf(guarded, return_type)
        # with_column's form: (ok, value), evaluated once per row (nondeterministic: Spark neither
        # duplicates it into the filter nor reorders it), so a failing row fails its record once
        self._checked = F.udf(checked, _ok_value_type(return_type)).asNondeterministic()

    def __call__(self, *cols: Column | str) -> Column:
        from pyspark.sql import functions as F

        meta = F.col(METADATA_COLUMN)
        return self._udf(meta.getField("sid"), meta.getField("source"), *cols)


    def with_column(self, df: DataFrame, name: str, *cols: Column | str) -> DataFrame:
        """``df`` with column ``name`` = ``fn(*cols)``, **without the rows where fn raised**.

        A raising row fails its source record (replayed, then dead-lettered) and does not flow on:
        a ``groupBy().count()`` downstream counts it only once its replay succeeds, where the
        column form (``udf(...)(cols)``) lets it through with null. Use this form when anything
        after the function aggregates or must not see a failed row.
        """
        from pyspark.sql import functions as F

        meta = F.col(METADATA_COLUMN)
        tmp = f"__ftlayer_{name}"
        checked = df.withColumn(tmp, self._checked(meta.getField("sid"), meta.getField("source"), *cols))
        return (checked.filter(F.col(tmp).getField("ok")).withColumn(name, F.col(tmp).getField("value"))
                .drop(tmp))


def _ok_value_type(return_type: DataType | str) -> DataType | str:
    """``struct<ok boolean, value return_type>``, as a DDL string for a DDL ``return_type``."""
    if isinstance(return_type, str):
        return f"struct<ok: boolean, value: {return_type}>"
    from pyspark.sql.types import BooleanType, StructField, StructType

    return StructType([StructField("ok", BooleanType(), False), StructField("value", return_type)])


def udf(fn: Callable[..., Any], return_type: DataType | str, *, config: FTConfig | None = None) -> FTUdf:
    """``ftlayer.udf(fn, returnType)``: call it on columns like ``F.udf``; see :class:`FTUdf`."""
    return FTUdf(fn, return_type, config)


def map_in_pandas(df: DataFrame, fn: Callable[[pd.DataFrame], pd.DataFrame], schema: StructType | str, *,
                  config: FTConfig | None = None) -> DataFrame:
    """``df.mapInArrow`` of ``fn`` over pandas frames, isolating poison rows (see module notes).

    ``fn`` sees ``_ftlayer`` as a column of dicts. The output has ``schema``'s
    columns; pass a schema with ``_ftlayer`` (``with_metadata``) and return that
    column to keep acking per row downstream.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    cfg = config_or_last(config)
    st = parse_schema(schema)
    arrow_schema = to_arrow_schema(st)
    where = f"map_in_pandas {getattr(fn, '__name__', 'fn')}"

    def to_batch(pdf: pd.DataFrame) -> Any:
        return pa.RecordBatch.from_pandas(pdf, schema=arrow_schema, preserve_index=False)

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            pdf = batch.to_pandas()
            try:
                yield to_batch(fn(pdf))
                continue
            except Exception:  # isolate the poison rows: re-run one row at a time
                pass
            for i in range(len(pdf)):
                row = pdf.iloc[i : i + 1].reset_index(drop=True)
                try:
                    out = to_batch(fn(row))
                except Exception as exc:
                    meta = row[METADATA_COLUMN].iloc[0]
                    fail_record(cfg, meta["source"], meta["sid"], exc, where)
                    continue
                if out.num_rows:
                    yield out

    return df.mapInArrow(run, st)


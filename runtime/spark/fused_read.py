"""The first operator stage, run inside the source's read task (one Python hop less).

A source read by exactly one operator chain (no fan-out) does not hand its rows to Spark
and take them back in a ``mapInArrow`` stage: the chain runs in the Python worker that
reads the source, on the batches it reads, and the source's DataFrame has the stage's
output columns (``runtime.spark.row_contract.STAGE_ROW``). That saves, per record, one
Arrow round trip between the JVM and a Python worker (Arrow to Spark rows and back,
measured at about a fifth of the JVM's CPU per record with FT off).

Nothing else changes: the stage is the same object with the same id, so its child ids,
deltas, fails, flush tokens (``st<stage>/p<partition>``, the partition being the channel)
and FT-off drop counts are what the separate stage would have produced.

The sources know nothing of this. The compiler (``runtime.spark.compile``) wraps a source's
reader with its stage: :func:`read_fused` reads format ``ftlayer_fused``
(:class:`FusedSource`), whose options are the inner source's (format :data:`INNER_OPTION`)
plus the stage (:data:`FUSED_OPTION`: the DataSource API takes strings only, so a base64
cloudpickle, unpickled in the executor at read time). Its reader (:class:`FusedReader`)
passes every offset, partition and commit call to the inner source's reader and runs the
stage over the batches the inner ``read()`` yields.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ftlayer.errors import ConfigError
from runtime.spark.admission import AvailableNowBase
from runtime.spark.channel_source import ChannelSource, ChannelStreamReader
from runtime.spark.feed_source import FeedSource
from runtime.spark.ft_data_sources import FTSource
from runtime.spark.row_contract import STAGE_ROW, stage_row_additions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from runtime.spark.stages import Stage  # not at run time: this module stays light (below)

__all__ = ["FORMAT", "FUSED_OPTION", "INNER_OPTION", "FusedReader", "FusedSource", "FusedStage", "decode",
           "fused_from", "read_fused"]

FORMAT = "ftlayer_fused"
FUSED_OPTION = "fused_stage"
INNER_OPTION = "fused_inner"  # the format of the source whose reader is wrapped
#: The sources a stage may be fused into, by format.
INNER_SOURCES: dict[str, type[ChannelSource]] = {FTSource.name(): FTSource, FeedSource.name(): FeedSource}


@dataclass(frozen=True)
class FusedStage:
    """The stage a source runs in its read task, and the source index its rows carry (``src``)."""

    src: int
    stage: Stage

    def encode(self) -> str:
        from pyspark import cloudpickle

        return base64.b64encode(cloudpickle.dumps(self)).decode("ascii")  # type: ignore[no-untyped-call]

    def run(self, batches: Iterable[Any]) -> Iterator[Any]:
        """The stage's output batches for the source's ``batches`` (SOURCE columns)."""
        return self.stage(self._rows(rb) for rb in batches)

    def _rows(self, rb: Any) -> Any:
        """A source batch as the rows a stage reads (SOURCE_ROW to STAGE_ROW: ``src`` and a zero
        ``delta`` added)."""
        import pyarrow as pa

        n = rb.num_rows
        schema = STAGE_ROW.arrow_schema()
        added = stage_row_additions(self.src)
        return pa.RecordBatch.from_arrays(
            [pa.repeat(pa.scalar(added[f.name], f.type), n) if f.name in added else rb.column(f.name)
             for f in schema],
            schema=schema)


def fused_from(options: Mapping[str, str]) -> str | None:
    """The encoded stage in a source's options (case-insensitive, as Spark passes them), or None."""
    return _option(options, FUSED_OPTION)


def decode(text: str) -> FusedStage:
    """The stage an option carries; ConfigError if it is not one."""
    import pickle

    try:
        # the option is written by our compiler on the driver (same trust as any pickled task)
        fused = pickle.loads(base64.b64decode(text.encode("ascii")))
    except Exception as exc:
        msg = f"source option {FUSED_OPTION!r} does not hold a stage the ftlayer compiler wrote: {exc}"
        raise ConfigError(msg) from exc
    if not isinstance(fused, FusedStage):
        msg = f"source option {FUSED_OPTION!r} holds a {type(fused).__name__}, not a fused stage"
        raise ConfigError(msg)
    return fused


def _option(options: Mapping[str, str], name: str) -> str | None:
    for key, value in options.items():
        if str(key).lower() == name:
            return str(value)
    return None


class FusedReader(DataSourceStreamReader, AvailableNowBase):  # type: ignore[misc]
    """A source's reader with the compiler's first stage run over what it reads.

    Offsets, partitions, commits and read limits are the inner reader's, call for call; ``read``
    yields the stage's output batches (STAGE_ROW) for the inner ``read``'s batches (SOURCE_ROW).
    """

    def __init__(self, inner: ChannelStreamReader, fused: str) -> None:
        self.inner = inner
        self.fused = fused  # decoded in the read task (decode), never on the driver

    def initialOffset(self) -> Any:
        return self.inner.initialOffset()

    def latestOffset(self, start: Any = None, limit: Any = None) -> Any:
        # the inner readers' signature: pyspark reads admission control from it
        return self.inner.latestOffset(start, limit)

    def getDefaultReadLimit(self) -> Any:
        return self.inner.getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        self.inner.prepareForTriggerAvailableNow()

    def reportLatestOffset(self) -> Any:
        return self.inner.reportLatestOffset()

    def partitions(self, start: Any, end: Any) -> Sequence[InputPartition]:
        return self.inner.partitions(start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The stage's output batches for the inner reader's batches of ``partition``."""
        return decode(self.fused).run(self.inner.read(partition))

    def commit(self, end: Any) -> None:
        self.inner.commit(end)

    def stop(self) -> None:
        self.inner.stop()


class FusedSource(DataSource):
    """``format("ftlayer_fused")``: the source of format ``fused_inner`` with the stage
    ``fused_stage`` run in its read tasks; its schema is the stage's rows (STAGE_ROW)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return STAGE_ROW.struct_type()

    def streamReader(self, schema: StructType) -> FusedReader:
        fused, inner = _option(self.options, FUSED_OPTION), _option(self.options, INNER_OPTION)
        if fused is None or inner not in INNER_SOURCES:
            msg = (f"a fused source needs options {FUSED_OPTION!r} and {INNER_OPTION!r} (one of "
                   f"{sorted(INNER_SOURCES)}); got {sorted(self.options)}")
            raise ConfigError(msg)
        if not STAGE_ROW.same_struct(schema):
            msg = f"a {inner} source with a fused stage has the stage's row schema; got {schema.simpleString()!r}"
            raise ConfigError(msg)
        options = {k: v for k, v in self.options.items() if str(k).lower() not in (FUSED_OPTION, INNER_OPTION)}
        source = INNER_SOURCES[inner](options)
        return FusedReader(source.streamReader(source.schema()), fused)


def read_fused(spark: SparkSession, inner_format: str, options: Mapping[str, str], fused: FusedStage) -> DataFrame:
    """A streaming DataFrame of the source ``inner_format`` read with ``options`` (as its own
    ``read_*`` function builds them), its reader wrapped with ``fused``'s stage (STAGE_ROW)."""
    spark.dataSource.register(FusedSource)
    wrapped = {**options, INNER_OPTION: inner_format, FUSED_OPTION: fused.encode()}
    return spark.readStream.format(FORMAT).options(**wrapped).load()

"""The first operator stage, run inside the source's read task (one Python hop less).

A source read by exactly one operator chain (no fan-out) does not hand its rows to Spark
and take them back in a ``mapInArrow`` stage: the chain runs in the Python worker that
reads the source, on the batches it reads, and the source's DataFrame has the stage's
output columns (``runtime.spark.row_contract.STAGE_ROW``). That saves, per record, one Arrow round trip between the
JVM and a Python worker (Arrow to Spark rows and back, measured at about a fifth of the
JVM's CPU per record with FT off).

Nothing else changes: the stage is the same object with the same id, so its child ids,
deltas, fails, flush tokens (``st<stage>/p<partition>``, the partition being the channel)
and FT-off drop counts are what the separate stage would have produced. The compiler
passes the stage to the source as an option (the DataSource API takes strings only): a
base64 cloudpickle, unpickled in the executor at read time.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ftlayer.errors import ConfigError
from runtime.spark.row_contract import STAGE_ROW
from runtime.spark.stages import Stage

FUSED_OPTION = "fused_stage"


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
        added = {"src": self.src, "delta": 0}
        return pa.RecordBatch.from_arrays(
            [pa.repeat(pa.scalar(added[f.name], f.type), n) if f.name in added else rb.column(f.name)
             for f in schema],
            schema=schema)


def fused_from(options: Mapping[str, str]) -> str | None:
    """The encoded stage in a source's options (case-insensitive, as Spark passes them), or None."""
    for key, value in options.items():
        if str(key).lower() == FUSED_OPTION:
            return str(value)
    return None


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

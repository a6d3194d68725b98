"""Rows between stages, held by column: what a stage decodes from an Arrow batch and emits.

The columns are :data:`runtime.spark.row_contract.STAGE_ROW`'s (:data:`ROW_COLUMNS`, their
numpy dtypes and Arrow schema come from there). A :class:`RowBatch` is the columnar form of the
rows ``(src, sid, cid, origin, value, carried delta)`` (``runtime.spark.handlers.Row``): the ids and deltas are
numpy ``int64``/``int32`` arrays taken from the Arrow batch without a copy, only
the values are Python objects. The per-record work a stage cannot avoid (unpack,
the user's function, pack) stays a Python loop; everything else (child ids,
deltas, channels, acks) is array arithmetic over the whole batch. The row form
(:meth:`RowBatch.rows`, :meth:`RowBatch.from_rows`) is the same data, for the
callers that want tuples.

A value is :data:`~runtime.spark.handlers.CARRIER` for a carrier row (null payload).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ftlayer.errors import SerializationError
from ftlayer.records.id_arrays import child_ids
from ftlayer.records.keyhash import NO_KEY_HASH
from ftlayer.records.record import MAX_PAYLOAD_BYTES
from runtime.spark.arrow_codec import payload_run
from runtime.spark.row_contract import STAGE_ROW
from serialization.payload import unpack_many, unpack_payload, unpack_run

__all__ = ["CARRIER", "ROW_COLUMNS", "Fanout", "Row", "RowBatch", "decode_batch", "encoded_to_arrow"]

ROW_COLUMNS = STAGE_ROW.names
_DTYPES = STAGE_ROW.numpy_dtypes()  # each fixed-width column's numpy dtype


class _Carrier:
    """Type of :data:`CARRIER`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CARRIER"


#: The value of a *carrier row*: a row with no record, only an XOR delta on its way to the sink.
CARRIER: Any = _Carrier()

# (source index, source record id, current id, origin id, value, carried delta). The carried
# delta is XORed into the acker by whichever terminal stage (the sink) receives the row.
Row = tuple[int, int, int, int, Any, int]


@dataclass
class RowBatch:
    """Rows of one Arrow batch, by column (see the module docstring). All columns have one length."""

    src: Any  # numpy int32
    sid: Any  # numpy int64
    cid: Any  # numpy int64
    origin: Any  # numpy int64
    values: list[Any]
    delta: Any  # numpy int64

    def __len__(self) -> int:
        return len(self.values)

    def take(self, index: Any, values: list[Any]) -> RowBatch:
        """The rows at ``index`` (a numpy index or mask) with ``values`` as their values."""
        return RowBatch(self.src[index], self.sid[index], self.cid[index], self.origin[index], values,
                        self.delta[index])

    def rows(self) -> Iterator[Row]:
        """The rows as tuples ``(src, sid, cid, origin, value, carried delta)`` of Python ints."""
        return zip(self.src.tolist(), self.sid.tolist(), self.cid.tolist(), self.origin.tolist(), self.values,
                   self.delta.tolist(), strict=True)

    @classmethod
    def from_rows(cls, rows: Sequence[Row]) -> RowBatch:
        """The batch of ``rows`` (tuples as :meth:`rows` yields them)."""
        def col(k: int, dtype: Any) -> Any:
            return np.fromiter((r[k] for r in rows), dtype=dtype, count=len(rows))

        d = _DTYPES
        return cls(col(0, d["src"]), col(1, d["sid"]), col(2, d["cid"]), col(3, d["origin"]), [r[4] for r in rows],
                   col(5, d["delta"]))


@dataclass(frozen=True)
class Fanout:
    """This stage reads copy ``index`` of a stream consumed by ``copies`` stages.

    Copy j of a record has current id ``child_id(cid, op_id, j)``. The stage
    reading copy 0 emits all copies (XORs them in and the original out); every
    stage acks its own copy, so each copy id is XORed exactly twice.
    """

    op_id: int
    index: int
    copies: int


class FailingHandler(Protocol):
    """What decoding needs of a task's handler (``runtime.spark.handlers.FTHandler``)."""

    ft_on: bool

    def fail(self, src: int, sid: int, exc: BaseException) -> None: ...


def _ints(rb: Any, name: str) -> Any:
    # no nulls in these columns: a view of Arrow's buffer, no copy
    return np.asarray(rb.column(name).to_numpy(zero_copy_only=False), dtype=_DTYPES[name])


def _values(rb: Any, handler: FailingHandler, src: Any, sid: Any) -> tuple[list[Any], Any]:
    """The batch's payloads unpacked (CARRIER for a null one) and a keep-mask, or None if every row
    is kept; a payload that cannot be unpacked fails its record (handler.fail), not the task, and
    has no value in the list.

    Without nulls, the payloads are unpacked as one run in one call (``unpack_run`` over the column's
    data buffer: no ``bytes`` object and no call per payload, about a quarter less per record than
    one ``unpackb`` each), as the DataFrame path's read does; any error there, and a batch with
    nulls, takes the payloads one by one. The run relies on each payload being one msgpack value,
    as ftlayer encodes them: a frame a caller built with a payload of two values next to an empty
    one (``persist_frames``) would shift the run's boundaries instead of failing its record.
    """
    import pyarrow.compute as pc

    column = rb.column("payload")
    if column.null_count == 0 and len(column) and pc.max(pc.binary_length(column)).as_py() <= MAX_PAYLOAD_BYTES:
        try:
            run = payload_run(column)
            return (unpack_run(run, len(column)) if run is not None else unpack_many(column.to_pylist())), None
        except SerializationError:  # a bad payload: find it below, one by one
            pass
    payloads = column.to_pylist()
    values: list[Any] = []
    keep = np.ones(len(payloads), dtype=bool)
    for i, p in enumerate(payloads):
        if p is None:
            values.append(CARRIER)
            continue
        try:
            values.append(unpack_payload(p))
        except Exception as exc:  # an input that cannot be decoded fails its record, not the task
            handler.fail(int(src[i]), int(sid[i]), exc)
            keep[i] = False
    return values, keep


def decode_batch(rb: Any, handler: FailingHandler, fanout: Fanout | None) -> RowBatch:
    """Decode an Arrow batch with (at least) the columns of ``STAGE_INPUT`` into a :class:`RowBatch`.

    A null payload decodes to CARRIER. With a fan-out, copy ``index`` gets its
    own current id; only the reader of copy 0 keeps the carried deltas and carrier
    rows (every copy reads the same upstream rows, and each delta must be applied
    exactly once) and adds the fan-out's own delta (the original out, every copy in).
    """
    src, sid = _ints(rb, "src"), _ints(rb, "sid")
    values, keep = _values(rb, handler, src, sid)
    cid = _ints(rb, "cid")
    origin, delta = _ints(rb, "origin"), _ints(rb, "delta")
    if keep is None:
        batch = RowBatch(src, sid, cid, origin, values, delta)
    else:  # the careful path: bad payloads dropped, carriers (null payloads) have no current id
        cid = np.where(rb.column("payload").is_null().to_numpy(zero_copy_only=False), 0, cid)
        batch = RowBatch(src[keep], sid[keep], cid[keep], origin[keep], values, delta[keep])
    fan = fanout if handler.ft_on else None  # FT off: no copy ids
    if fan is None:
        return batch
    records = np.fromiter((v is not CARRIER for v in batch.values), dtype=bool, count=len(batch))
    if fan.index != 0:  # carriers and carried deltas belong to copy 0's reader
        batch = batch.take(records, [v for v in batch.values if v is not CARRIER])
        copy = child_ids(batch.cid, fan.op_id, fan.index)
        return RowBatch(batch.src, batch.sid, copy, batch.origin, batch.values, np.zeros(len(batch), np.int64))
    copies = [child_ids(batch.cid, fan.op_id, j) for j in range(fan.copies)]
    fan_delta = batch.cid.copy()
    for copy in copies:
        fan_delta ^= copy
    delta = np.where(records, batch.delta ^ fan_delta, batch.delta)
    cid = np.where(records, copies[0], batch.cid)
    return RowBatch(batch.src, batch.sid, cid, batch.origin, batch.values, delta)


def encoded_to_arrow(batch: RowBatch, n: int) -> Any:
    """A stage's output rows, each value ``(payload, key_hash)`` or CARRIER, as an Arrow batch of
    ``ROW_COLUMNS``; channel = ``key_hash mod n`` (what a keyed edge routes by).

    A carrier row goes to channel ``sid mod n``: any partition may apply a delta,
    and this choice is deterministic.
    """
    import pyarrow as pa

    values = batch.values
    carriers = [i for i, v in enumerate(values) if v is CARRIER] if CARRIER in values else []
    if carriers:
        filler = (None, NO_KEY_HASH)
        values = [filler if v is CARRIER else v for v in values]
    payloads = [v[0] for v in values]
    hashes = [v[1] for v in values]
    kh = np.fromiter(hashes, dtype=_DTYPES["key_hash"], count=len(values))
    channel = np.mod(kh, n)
    if carriers:
        channel[carriers] = np.mod(batch.sid[carriers], n)
    columns = {"src": batch.src, "sid": batch.sid, "cid": batch.cid, "origin": batch.origin, "key_hash": kh,
               "channel": channel.astype(_DTYPES["channel"]), "payload": payloads, "delta": batch.delta}
    schema = STAGE_ROW.arrow_schema()
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in schema], schema=schema)

"""FT handlers: what wraps a source, an operator or a sink, after the original design.

``FTHandler`` is made of two parts (the design's third, the Persister of sources, is no
handler here: the driver's ingest, :class:`runtime.driver.ingest.Ingestor`, gives each raw
record its ids, hashes its key, routes it to a channel and persists it through
``FTLayer.persist_chunks`` before a read may emit it):

- **AnchorHandler** (operators): ties every output of a user function to its
  input record's RecordId: the same source record id, and a child id
  ``child_id(input current id, operator, output index)``, so a retried Spark
  task produces exactly the same ids. It works on a whole batch of rows at
  once (:class:`~runtime.spark.row_batch.RowBatch`): ids and deltas are array
  arithmetic; only the user function runs per record.
- **XorHandler** (operators and sinks, :mod:`runtime.spark.xor_handler`): XORs each output id in and the input id
  out (the ack). An operator puts the delta of each input on its first output
  (or on a *carrier row* when it has none), so deltas cross Spark exchanges
  with the data; the sink combines everything it received per source record,
  sends the deltas that complete records as it goes (``sink_ack_every_records``,
  applied only where they complete, so safe without a token) and flushes the
  rest once per task with an idempotent token. Fails (``FailRecord`` or
  any other exception in user code, a key selector, packing an output, keyed
  state, or decoding an input) are flushed by the task that saw them; a
  ``FailRecord(..., replay=False)`` is dead-lettered without replays.

``NonFTHandler`` does none of that: no ids, no Redis. The FT status in config
picks the handler; user code does not change.

Fault injection (tests and ``ftlayer chaos`` only): when
:func:`~runtime.spark.xor_handler.duplicate_flushes` is true at flush time, :meth:`XorHandler.flush` sends
every call twice with the same token, as a client retry after a lost reply
would. The second call must be skipped by the server (counted in
``duplicate_flushes``) and change nothing. It is switched on by the environment
variable ``FTLAYER_CHAOS_DUPLICATE_FLUSH=1`` in the process that flushes (Python
workers inherit the environment of the Spark JVM, i.e. of the driver *when the
SparkSession was created*; on a cluster use ``spark.executorEnv.*``), or, for a
session that is already running, by the Spark local property
``ftlayer.chaos.duplicateFlush = "1"`` set on the driver thread before the query
starts (tasks of that query see it through ``TaskContext``).

Handlers are created per task in executors; they are not shared across
threads.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ftlayer.acker.flush_tokens import FlushToken
from ftlayer.errors import FailRecord
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.id_arrays import child_ids, xor_by_group
from runtime.spark.current_record import CURRENT
from runtime.spark.output_encoding import OutputEncoder
from runtime.spark.row_batch import CARRIER, Row, RowBatch
from runtime.spark.xor_handler import DUPLICATE_FLUSH_ENV, DUPLICATE_FLUSH_PROPERTY, XorHandler, duplicate_flushes

__all__ = [
    "CARRIER", "DUPLICATE_FLUSH_ENV", "DUPLICATE_FLUSH_PROPERTY", "AnchorHandler", "FTHandler", "NonFTHandler", "Row",
    "XorHandler", "duplicate_flushes", "failure_reason", "handler_for", "wants_replay",
]

MAX_TRACEBACK_CHARS = 4000
_CARRIED = -1  # per-input output count of a carrier row (it passes through as it is)
_FAILED = -2  # per-input output count of a record whose chain raised (no row at all)


def wants_replay(exc: BaseException) -> bool:
    """False for ``FailRecord(..., replay=False)``: dead-letter at once. Every other error is replayed."""
    return not isinstance(exc, FailRecord) or exc.replay


def failure_reason(exc: BaseException) -> str:
    """The reason stored with a failed record: FailRecord's text, else the traceback."""
    if isinstance(exc, FailRecord):
        return f"FailRecord: {exc.reason}" if exc.replay else f"FailRecord (replay=False): {exc.reason}"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-MAX_TRACEBACK_CHARS:]


class AnchorHandler:
    """Anchors a batch's outputs to their inputs: child ids and the deltas the outputs carry.

    Pure: the rows it returns depend on the input rows and the outputs alone (never on
    how Spark cut the Arrow batches), so a recomputed task carries exactly the same ids
    and deltas to the same partitions.
    """

    __slots__ = ("operator_id",)

    def __init__(self, operator_id: int) -> None:
        self.operator_id = operator_id

    def anchor(self, batch: RowBatch, counts: Sequence[int], outputs: list[Any]) -> RowBatch:
        """The output rows for ``batch``, given each input's output count and all outputs in order.

        ``counts[i]`` is how many of ``outputs`` input ``i`` produced, or -1 for a carrier
        row (passed through with its delta), or -2 for a failed record (no row). Per input,
        the delta ``carried ^ input id ^ XOR(child ids)`` rides on its first output; an
        input with no output becomes a carrier row holding that delta.
        """
        n = len(batch)
        op = self.operator_id
        c = np.asarray(counts, dtype=np.int64)
        if len(outputs) == n and (n == 0 or int(c.min()) == 1):  # a map: one output each, no lists
            child = child_ids(batch.cid, op, 0)
            return RowBatch(batch.src, batch.sid, child, batch.origin, outputs, batch.delta ^ batch.cid ^ child)
        rows_per = np.where(c == _FAILED, 0, np.maximum(c, 1))  # no output, or a carrier: one carrier row
        idx = np.repeat(np.arange(n), rows_per)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(rows_per[:-1], out=starts[1:])
        index = np.arange(idx.size) - np.repeat(starts, rows_per)  # output index within its input
        real = np.repeat(c >= 1, rows_per)
        child = np.where(real, child_ids(batch.cid[idx], op, index), 0)
        kept = rows_per > 0
        base = batch.delta ^ np.where(c == _CARRIED, 0, batch.cid)
        delta = np.zeros(idx.size, dtype=np.int64)
        delta[starts[kept]] = base[kept] ^ xor_by_group(child, starts[kept])
        values: list[Any] = [CARRIER] * idx.size
        for at, out in zip(np.flatnonzero(real).tolist(), outputs, strict=True):
            values[at] = out
        return RowBatch(batch.src[idx], batch.sid[idx], child, batch.origin[idx], values, delta)


Chain = Callable[[Any], list[Any]]


class FTHandler:
    """Operating handler of one task: anchors, derives child ids, XORs and fails.

    Deltas travel *in-band*: an operator does not flush its own XORs, it puts
    them on its outputs and the sink flushes everything it received in one
    call per task (see :meth:`process_batch`). Only explicit fails are flushed by
    an intermediate stage.
    """

    ft_on = True

    def __init__(self, operator_id: int) -> None:
        self.operator_id = operator_id
        self.anchors = AnchorHandler(operator_id)
        self.xors = XorHandler()
        self.failed = 0
        self.dropped: dict[int, int] = {}  # FT off only: records dropped by FailRecord, per source index
        self.layers: Callable[[], dict[int, FTLayer]] | None = None  # set by the stage: reset_timeout

    def process_batch(self, batch: RowBatch, chain: Chain, encoder: OutputEncoder | None = None) -> RowBatch:
        """Run ``chain`` on each input of ``batch``; the outputs with child ids and the deltas they carry.

        Per input row, the delta ``carried ^ input id ^ XOR(child ids)`` rides
        on its first output; an input with no output yields a carrier row
        holding the delta instead, and carrier inputs pass through (see
        :meth:`AnchorHandler.anchor`). A record whose chain raises is failed
        (its whole tree; the failure is flushed by the task) and yields
        nothing: its carried delta is dropped, as any later delta of a failed
        record is ignored.

        With ``encoder``, the outputs leave as ``(payload, key_hash)``: encoded for the whole batch
        at once, or, if any output cannot be encoded, record by record, failing each record one of
        whose outputs cannot be (as an error in ``chain`` does).
        """
        outputs: list[Any] = []
        counts: list[int] = []
        count, extend = counts.append, outputs.extend
        current = CURRENT  # which record the user's function runs on (ftlayer.reset_timeout)
        current.begin(batch, True, self.layers)
        try:
            for i, value in enumerate(batch.values):
                if value is CARRIER:
                    count(_CARRIED)
                    continue
                current.index = i
                try:
                    out = chain(value)
                except Exception as exc:  # any user error fails the record, not the query
                    self.fail(int(batch.src[i]), int(batch.sid[i]), exc)
                    count(_FAILED)
                    continue
                count(len(out))
                extend(out)
        finally:
            current.end()
        if encoder is not None and outputs:
            outputs = self._encode(batch, counts, outputs, encoder)
        return self.anchors.anchor(batch, counts, outputs)

    def _encode(self, batch: RowBatch, counts: list[int], outputs: list[Any], encoder: OutputEncoder) -> list[Any]:
        """``outputs`` encoded (see :meth:`process_batch`); for a record with an output that cannot be,
        :meth:`_unencodable` says what becomes of it, and its outputs are left out."""
        try:
            return encoder.many(outputs)
        except Exception:  # some output cannot be encoded: find its record, one by one
            pass
        encoded: list[Any] = []
        at = 0
        current = CURRENT
        current.begin(batch, self.ft_on, self.layers)  # the key selector runs on its record, as in chain
        try:
            for i, c in enumerate(counts):
                if c <= 0:
                    continue
                mine, at = outputs[at : at + c], at + c
                current.index = i
                try:
                    encoded.extend([encoder.one(o) for o in mine])
                except Exception as exc:  # a key selector or an output msgpack cannot carry
                    counts[i] = self._unencodable(batch, i, exc)
        finally:
            current.end()
        return encoded

    def _unencodable(self, batch: RowBatch, i: int, exc: Exception) -> int:
        """Input ``i`` has an output that cannot be encoded: fail its record, as an error in the chain
        does; its new output count."""
        self.fail(int(batch.src[i]), int(batch.sid[i]), exc)
        return _FAILED

    def receive_batch(self, batch: RowBatch) -> RowBatch:
        """At the sink: apply the carrier rows' deltas now (they hold no record and stand
        whatever the write does) and return the record rows, to be written and then acked
        with ``cid ^ delta``."""
        records = [v is not CARRIER for v in batch.values]
        if all(records):
            return batch
        mask = np.asarray(records, dtype=bool)
        carriers = ~mask
        self.xors.xor_many(batch.src[carriers], batch.sid[carriers], batch.delta[carriers])
        return batch.take(mask, [v for v in batch.values if v is not CARRIER])

    def receive(self, rows: Iterable[Row]) -> list[Row]:
        """:meth:`receive_batch` for rows as tuples."""
        return list(self.receive_batch(RowBatch.from_rows(list(rows))).rows())

    def ack_batch(self, batch: RowBatch) -> None:
        """A sink acks every row of ``batch`` (``cid ^ carried delta``) after its write succeeded."""
        self.xors.xor_many(batch.src, batch.sid, batch.cid ^ batch.delta)

    def ack(self, rows: Iterable[tuple[int, int, int]]) -> None:
        """A sink acks ``(src, sid, cid ^ carried delta)`` after its write succeeded."""
        triples = list(rows)
        if triples:
            src, sid, value = zip(*triples, strict=True)
            self.xors.xor_many(src, sid, value)

    def fail(self, src: int, sid: int, exc: BaseException) -> None:
        """Fail one record's tree for ``exc`` (flushed by this task): replayed, or dead-lettered
        at once for ``FailRecord(..., replay=False)``."""
        self.xors.fail(src, sid, failure_reason(exc), replay=wants_replay(exc))
        self.failed += 1

    def fail_all(self, rows: Iterable[tuple[int, int, int]], exc: BaseException) -> None:
        """Fail every record of a failed sink write (they will be replayed)."""
        reason, replay = failure_reason(exc), wants_replay(exc)
        for src, sid, _ in rows:
            self.xors.fail(src, sid, reason, replay=replay)
            self.failed += 1

    def flush(self, layers: Mapping[int, FTLayer], token: str | FlushToken) -> None:
        if not self.xors.empty():
            self.xors.flush(layers, token)

    def flush_completing(self, layers: Mapping[int, FTLayer], written: Sequence[RowBatch]) -> int:
        """Ack now the records of the rows ``written`` whose trees this task's deltas complete
        (see :meth:`XorHandler.flush_completing`)."""
        if not written:
            return 0
        return self.xors.flush_completing(layers, np.concatenate([b.src for b in written]),
                                          np.concatenate([b.sid for b in written]))

    def still_pending(self, layers: Mapping[int, FTLayer], batch: RowBatch) -> RowBatch:
        """The rows whose source record is still pending (a retried task's filter): a record an
        earlier attempt completed was written, and one that failed will be replayed."""
        keep = np.zeros(len(batch), dtype=bool)
        for src in np.unique(batch.src).tolist():
            at = np.flatnonzero(batch.src == src)
            flags = layers[src].pending_of(batch.sid[at].tolist())
            keep[at] = np.asarray(flags, dtype=bool)
        return batch.take(keep, [v for v, k in zip(batch.values, keep.tolist(), strict=True) if k])


class NonFTHandler(FTHandler):
    """Non-operating handler (FT status off): same calls, no ids, no XOR, no Redis.

    ``dropped`` counts the records ``FailRecord`` dropped, per source index
    (reported to the driver through ``TaskEnv.dropped``).
    """

    ft_on = False

    def process_batch(self, batch: RowBatch, chain: Chain, encoder: OutputEncoder | None = None) -> RowBatch:
        outputs: list[Any] = []
        counts: list[int] = []
        count, extend = counts.append, outputs.extend
        CURRENT.begin(batch, False, None)  # reset_timeout() is a no-op with FT off
        CURRENT.index = 0
        try:
            for i, value in enumerate(batch.values):
                try:
                    out = chain(value)
                except FailRecord:  # FT off: nothing can replay it; the record is dropped and counted
                    self._drop(batch, i)
                    count(0)
                    continue
                count(len(out))
                extend(out)
        finally:
            CURRENT.end()
        if encoder is not None and outputs:
            outputs = self._encode(batch, counts, outputs, encoder)
        if len(outputs) == len(batch) and (not counts or min(counts) == 1):
            return RowBatch(batch.src, batch.sid, batch.cid, batch.origin, outputs, np.zeros(len(batch), np.int64))
        out_rows = batch.take(np.repeat(np.arange(len(batch)), counts), outputs)
        out_rows.delta = np.zeros(len(outputs), np.int64)
        return out_rows

    def _drop(self, batch: RowBatch, i: int) -> None:
        self.failed += 1
        src = int(batch.src[i])
        self.dropped[src] = self.dropped.get(src, 0) + 1

    def _unencodable(self, batch: RowBatch, i: int, exc: Exception) -> int:
        """FT off: a ``FailRecord`` from a key selector drops its record (counted); any other error of an
        output raises (Spark's rules), as when the encoding ran inside the chain."""
        if not isinstance(exc, FailRecord):
            raise exc
        self._drop(batch, i)
        return 0

    def receive_batch(self, batch: RowBatch) -> RowBatch:
        return batch

    def ack_batch(self, batch: RowBatch) -> None:
        return None

    def ack(self, rows: Iterable[tuple[int, int, int]]) -> None:
        return None

    def fail(self, src: int, sid: int, exc: BaseException) -> None:
        raise exc  # FT off: nothing could replay or dead-letter it; Spark's rules apply

    def fail_all(self, rows: Iterable[tuple[int, int, int]], exc: BaseException) -> None:
        raise exc

    def flush(self, layers: Mapping[int, FTLayer], token: str | FlushToken) -> None:
        return None

    def flush_completing(self, layers: Mapping[int, FTLayer], written: Sequence[RowBatch]) -> int:
        return 0

    def still_pending(self, layers: Mapping[int, FTLayer], batch: RowBatch) -> RowBatch:
        return batch


def handler_for(ft_on: bool, operator_id: int) -> FTHandler:
    """The handler the FT status asks for."""
    return FTHandler(operator_id) if ft_on else NonFTHandler(operator_id)

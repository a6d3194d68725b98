"""FT handlers: what wraps a source, an operator or a sink, after the original design.

``FTHandler`` is made of three parts:

- **Persister** (sources): gives each raw record a RecordId, hashes its key,
  serializes it into a SemiDeserializedRecord, routes it to a channel and
  persists it before it may be emitted.
- **AnchorHandler** (operators): remembers the input record's RecordId while
  the user function runs, and gives every output a child id under the same
  source record id. Child ids are ``child_id(input current id, operator, output
  index)``, so a retried Spark task produces exactly the same ids.
- **XorHandler** (operators and sinks): XORs each output id in and the input id
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
:func:`duplicate_flushes` is true at flush time, :meth:`XorHandler.flush` sends
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

import os
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ftlayer.acker_table import FlushResult
from ftlayer.errors import FailRecord
from ftlayer.flush_tokens import FlushToken
from ftlayer.ids import child_id
from ftlayer.layer import FTLayer

MAX_TRACEBACK_CHARS = 4000
DUPLICATE_FLUSH_ENV = "FTLAYER_CHAOS_DUPLICATE_FLUSH"
DUPLICATE_FLUSH_PROPERTY = "ftlayer.chaos.duplicateFlush"


def duplicate_flushes() -> bool:
    """True when the duplicated-flush fault is switched on for this process or task (see module notes)."""
    if os.environ.get(DUPLICATE_FLUSH_ENV) == "1":
        return True
    try:
        from pyspark import TaskContext
    except ImportError:  # no Spark here: only the environment switch applies
        return False
    tc = TaskContext.get()
    return tc is not None and tc.getLocalProperty(DUPLICATE_FLUSH_PROPERTY) == "1"


def wants_replay(exc: BaseException) -> bool:
    """False for ``FailRecord(..., replay=False)``: dead-letter at once. Every other error is replayed."""
    return not isinstance(exc, FailRecord) or exc.replay


def failure_reason(exc: BaseException) -> str:
    """The reason stored with a failed record: FailRecord's text, else the traceback."""
    if isinstance(exc, FailRecord):
        return f"FailRecord: {exc.reason}" if exc.replay else f"FailRecord (replay=False): {exc.reason}"
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-MAX_TRACEBACK_CHARS:]


@dataclass
class XorHandler:
    """Per-task XOR accumulator: combined deltas and fails per (source index, source record id).

    ``no_replay`` holds the failed ids to dead-letter at once (the first fail of an id in a
    task decides its reason and whether it is replayed).
    """

    deltas: dict[int, dict[int, int]] = field(default_factory=dict)
    fails: dict[int, dict[int, str]] = field(default_factory=dict)
    no_replay: dict[int, set[int]] = field(default_factory=dict)

    def xor(self, src: int, sid: int, value: int) -> None:
        per = self.deltas.setdefault(src, {})
        per[sid] = per.get(sid, 0) ^ value

    def flush_completing(self, layers: Mapping[int, FTLayer], ids: Iterable[tuple[int, int, int]]) -> int:
        """Send the combined delta of each ``(src, sid, _)`` in ``ids`` (the rows written since the
        last call), to be applied only where it completes the record (:meth:`FTLayer.complete`);
        forget those ids, keep the rest for a later flush. Returns how many records completed.

        Safe without a token: a completing delta deletes its record, so sending it again (a
        retry of this call, a retried task) changes nothing; a delta that does not complete is
        never applied here, so it cannot be applied twice. Ids this task failed are left for
        :meth:`flush` (their fail goes first there).
        """
        send: dict[int, dict[int, int]] = {}
        for src, sid, _ in ids:
            value = self.deltas.get(src, {}).get(sid)
            if value and sid not in self.fails.get(src, {}):
                send.setdefault(src, {})[sid] = value
        completed = 0
        for src, deltas in send.items():
            per = self.deltas[src]
            for sid in layers[src].complete(deltas).acked:
                del per[sid]
                completed += 1
        return completed

    def fail(self, src: int, sid: int, reason: str, *, replay: bool = True) -> None:
        per = self.fails.setdefault(src, {})
        if sid in per:
            return
        per[sid] = reason
        if not replay:
            self.no_replay.setdefault(src, set()).add(sid)

    def empty(self) -> bool:
        return not any(self.deltas.values()) and not any(self.fails.values())

    def flush(self, layers: Mapping[int, FTLayer], token: str | FlushToken) -> dict[int, FlushResult]:
        """Send everything accumulated, one call per source, then reset. Idempotent per token.

        With :func:`duplicate_flushes` on, each call is sent a second time with the same
        token (fault injection); the first call's result is returned.
        """
        out: dict[int, FlushResult] = {}
        twice = duplicate_flushes()
        for src in sorted(set(self.deltas) | set(self.fails)):
            deltas = {sid: v for sid, v in self.deltas.get(src, {}).items() if v}
            fails = self.fails.get(src, {})
            if deltas or fails:
                final = self.no_replay.get(src, set())
                part = token.child(f"s{src}") if isinstance(token, FlushToken) else f"{token}/s{src}"
                out[src] = layers[src].xor(deltas, token=part, fails=fails, no_replay=final)
                if twice:
                    layers[src].xor(deltas, token=part, fails=fails, no_replay=final)
        self.deltas.clear()
        self.fails.clear()
        self.no_replay.clear()
        return out


class AnchorHandler:
    """Holds the anchor (input) record while a user function runs; derives child ids."""

    __slots__ = ("cid", "sid", "src")

    def __init__(self) -> None:
        self.src = 0
        self.sid = 0
        self.cid = 0

    def anchor(self, src: int, sid: int, cid: int) -> None:
        self.src, self.sid, self.cid = src, sid, cid

    def child(self, operator_id: int, index: int) -> int:
        return child_id(self.cid, operator_id, index)


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
Chain = Callable[[Any], list[Any]]


class FTHandler:
    """Operating handler of one task: anchors, derives child ids, XORs and fails.

    Deltas travel *in-band*: an operator does not flush its own XORs, it puts
    them on its outputs and the sink flushes everything it received in one
    call per task (see :meth:`process`). Only explicit fails are flushed by
    an intermediate stage.
    """

    ft_on = True

    def __init__(self, operator_id: int) -> None:
        self.operator_id = operator_id
        self.anchor = AnchorHandler()
        self.xors = XorHandler()
        self.failed = 0
        self.dropped: dict[int, int] = {}  # FT off only: records dropped by FailRecord, per source index

    def process(self, rows: Iterable[Row], chain: Chain) -> Iterator[Row]:
        """Run ``chain`` on each input; yield outputs with child ids and the delta they carry.

        Per input row, the delta ``carried ^ input id ^ XOR(child ids)`` rides
        on its first output; an input with no output yields a carrier row
        holding the delta instead, and carrier inputs pass through. The
        delta depends on that row alone (never on how Spark cut the Arrow
        batches), so a recomputed task carries exactly the same deltas to
        the same partitions. A record whose chain raises is failed (its
        whole tree; the failure is flushed by the task) and yields nothing:
        its carried delta is dropped, as any later delta of a failed record
        is ignored.
        """
        anchor, op = self.anchor, self.operator_id
        for src, sid, cid, origin, value, carried in rows:
            if value is CARRIER:
                yield src, sid, 0, origin, CARRIER, carried
                continue
            anchor.anchor(src, sid, cid)
            try:
                outputs = chain(value)
            except Exception as exc:  # any user error fails the record, not the query
                self.fail(src, sid, exc)
                continue
            delta = carried ^ cid
            if len(outputs) == 1:  # the common case (map), without the lists
                child = child_id(cid, op, 0)
                yield src, sid, child, origin, outputs[0], delta ^ child
                continue
            if not outputs:
                yield src, sid, 0, origin, CARRIER, delta
                continue
            children = [child_id(cid, op, i) for i in range(len(outputs))]
            for child in children:
                delta ^= child
            for i, out in enumerate(outputs):
                yield src, sid, children[i], origin, out, delta if i == 0 else 0

    def receive(self, rows: Iterable[Row]) -> list[Row]:
        """At the sink: apply the carrier rows' deltas now (they hold no record and stand
        whatever the write does) and return the record rows, to be written and then acked
        with ``cid ^ delta``."""
        xor = self.xors.xor
        out: list[Row] = []
        for row in rows:
            if row[4] is CARRIER:
                xor(row[0], row[1], row[5])
            else:
                out.append(row)
        return out

    def ack(self, rows: Iterable[tuple[int, int, int]]) -> None:
        """A sink acks ``(src, sid, cid ^ carried delta)`` after its write succeeded."""
        xor = self.xors.xor
        for src, sid, value in rows:
            xor(src, sid, value)

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

    def flush_completing(self, layers: Mapping[int, FTLayer], ids: Iterable[tuple[int, int, int]]) -> int:
        """Ack now the records of ``ids`` whose trees this task's deltas complete (see XorHandler)."""
        return self.xors.flush_completing(layers, ids)

    def still_pending(self, layers: Mapping[int, FTLayer], rows: list[Row]) -> list[Row]:
        """The rows whose source record is still pending (a retried task's filter): a record an
        earlier attempt completed was written, and one that failed will be replayed."""
        by_src: dict[int, list[int]] = {}
        for row in rows:
            by_src.setdefault(row[0], []).append(row[1])
        alive: dict[int, set[int]] = {}
        for src, sids in by_src.items():
            flags = layers[src].pending_of(sids)
            alive[src] = {sid for sid, ok in zip(sids, flags, strict=True) if ok}
        return [row for row in rows if row[1] in alive[row[0]]]


class NonFTHandler(FTHandler):
    """Non-operating handler (FT status off): same calls, no ids, no XOR, no Redis.

    ``dropped`` counts the records ``FailRecord`` dropped, per source index
    (reported to the driver through ``TaskEnv.dropped``).
    """

    ft_on = False

    def process(self, rows: Iterable[Row], chain: Chain) -> Iterator[Row]:
        for src, sid, cid, origin, value, _ in rows:
            try:
                outputs = chain(value)
            except FailRecord:  # FT off: nothing can replay it; the record is dropped and counted
                self.failed += 1
                self.dropped[src] = self.dropped.get(src, 0) + 1
                continue
            for out in outputs:
                yield src, sid, cid, origin, out, 0

    def ack(self, rows: Iterable[tuple[int, int, int]]) -> None:
        return None

    def fail(self, src: int, sid: int, exc: BaseException) -> None:
        raise exc  # FT off: nothing could replay or dead-letter it; Spark's rules apply

    def fail_all(self, rows: Iterable[tuple[int, int, int]], exc: BaseException) -> None:
        raise exc

    def flush(self, layers: Mapping[int, FTLayer], token: str | FlushToken) -> None:
        return None

    def flush_completing(self, layers: Mapping[int, FTLayer], ids: Iterable[tuple[int, int, int]]) -> int:
        return 0

    def still_pending(self, layers: Mapping[int, FTLayer], rows: list[Row]) -> list[Row]:
        return rows


def handler_for(ft_on: bool, operator_id: int) -> FTHandler:
    """The handler the FT status asks for."""
    return FTHandler(operator_id) if ft_on else NonFTHandler(operator_id)

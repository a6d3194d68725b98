"""AckerTable: source_record_id -> 64-bit XOR ack value, kept in Redis.

A source record's tree is complete when its ack value returns to 0 for the
first time: every record id in the tree has been XORed in once (when emitted)
and out once (when acked). Contract of :meth:`AckerTable.xor`:

- **Atomic and exact.** All deltas of one call are applied in one server-side
  script, with exact 64-bit XOR (two 32-bit halves in Lua).
- **First zero only.** The ids returned as acked reached 0 in this call. The
  same call marks the record settled in its chunk (and deletes the chunk with
  its last record), so an id is reported acked at most once.
- **State per chunk.** Ack values live in the record's chunk (``ftlayer.records.chunks``):
  the initial value of every record in one array, a settled bit per record,
  and a per-record value (``xv``) only for a record whose tree was flushed in
  parts. Deltas are sent sorted by id, so the records of one chunk come
  together and the server loads and writes each chunk once per call.
- **Late deltas are ignored.** A delta for an id that is no longer pending
  (completed, or failed and handed to the replayer) changes nothing and is
  counted as late. A late ack never resurrects a record.
- **Idempotent per token.** A call with a flush token that was already applied
  is skipped whole and reports ``applied=False``. Tokens are kept per batch
  (``ftlayer.acker.flush_tokens``: one hash per micro-batch of a query, deleted when
  the batch commits) and expire after ``token_ttl_ms`` at the latest; a delta
  applied twice after that cancels itself out (XOR is an involution), which can
  only delay completion into a timeout and replay, never complete a record
  early or lose it.
- **Order-free.** Deltas commute: flushes of different tasks may land in any
  order.
- **Bad input is refused whole.** Every id and delta must be a signed 64-bit
  integer and every fail reason a ``str``; otherwise :class:`InvalidIdError`
  (or :class:`InvalidArgumentError` for a reason) names the first offender and
  nothing is applied and no token is spent. A flush larger than
  ``flush_batch_size`` is packed and checked whole before its first chunk is
  sent, so bad input in a later chunk cannot leave it half applied. (A
  connection lost between chunks can: the caller's retry with the same token
  then applies exactly the chunks that are missing.)

Cost: one round trip per ``min(flush_batch_size, FLUSH_MAX_RECORDS)`` deltas; server work O(deltas).
Deltas may come as :class:`~ftlayer.records.delta_arrays.DeltaArrays` (combined in numpy by a task):
same calls, same effect, no Python object per record.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ftlayer.acker.flush_tokens import FlushToken, as_token
from ftlayer.errors import InvalidArgumentError, InvalidIdError
from ftlayer.records.chunks import ChunkState, chunk_key, index_of
from ftlayer.records.delta_arrays import DeltaArrays
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.scripting.script_bounds import FLUSH_MAX_RECORDS
from ftlayer.store.id_blobs import pack_ids
from ftlayer.store.source_store import SourceStore

MAX_REASON_BYTES = 8192
_OTHER = struct.Struct(">IB")  # FLUSH's reply: position of a delta that did not complete, its status
NO_REPLAY_FLAG = 0x8000  # top bit of a fail's reason length (reasons are < 2**15 bytes): dead-letter at once
# how long a replaced link (rpl: a timed-out record -> its replay's id, REPLAY) or a FLUSH's no-copy
# mark lasts: a batch that commits later than this after its records timed out no longer finds them
REPLACED_LINK_TTL_S = 24 * 3600

# The scripts this module runs (ftlayer.scripting.lua_script: their KEYS and ARGV, checked at each call)
FLUSH = LuaScript(
    "FLUSH", keys=(*STATE_KEYS, "tok:*", "rpl?"),
    argv=("prefix", "use_token", "token_ttl_ms", "deltas", "fails", "now_ms", "backoff_initial_ms",
          "backoff_multiplier", "backoff_max_ms", "token_field", "completing_only?", "link_ttl_ms?"),
)
PENDING = LuaScript("PENDING", keys=("ck",), argv=("prefix", "sids"))


@dataclass(frozen=True)
class FlushResult:
    """What one flush did. ``acked`` lists the ids that completed in this flush."""

    applied: bool = True
    acked: list[int] = field(default_factory=list)
    late: int = 0
    failed: int = 0

    def merge(self, other: FlushResult) -> FlushResult:
        """Sum of two results (for chunked flushes)."""
        return FlushResult(
            self.applied and other.applied,
            self.acked + other.acked,
            self.late + other.late,
            self.failed + other.failed,
        )


def combine_deltas(deltas: Iterable[tuple[int, int]]) -> dict[int, int]:
    """XOR-combine (source id, value) pairs per source id, dropping ids whose delta is 0.

    Pure. Combining inside a task before flushing turns a whole operator chain
    into one delta per source record.
    """
    out: dict[int, int] = {}
    for sid, value in deltas:
        out[sid] = out.get(sid, 0) ^ value
    return {sid: v for sid, v in out.items() if v}


def pack_deltas(deltas: Mapping[int, int]) -> bytes:
    """Deltas as [sid 8][value 8] big-endian pairs, sorted by sid (deterministic chunks)."""
    flat: list[int] = []
    for sid in sorted(deltas):
        flat.append(sid)
        flat.append(deltas[sid])
    return struct.pack(f">{len(flat)}q", *flat)


def pack_fails(fails: Mapping[int, str], no_replay: Collection[int] = ()) -> bytes:
    """Fails as [sid 8][reason length u16][reason utf-8], reasons cut to 8 KiB; the length's
    top bit (:data:`NO_REPLAY_FLAG`) marks an id in ``no_replay``, to dead-letter without replays."""
    parts: list[bytes] = []
    for sid in sorted(fails):
        reason = fails[sid].encode("utf-8", "replace")[:MAX_REASON_BYTES]
        flag = NO_REPLAY_FLAG if sid in no_replay else 0
        parts.append(struct.pack(">qH", sid, len(reason) | flag) + reason)
    return b"".join(parts)


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _is_i64(value: object) -> bool:
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return _I64_MIN <= n <= _I64_MAX


def bad_id_error(what: str, where: str, value: object) -> InvalidIdError:
    """The error for an id or delta that is no signed 64-bit integer (shown cut to 80 chars)."""
    msg = (
        f"{where}: {what} {value!r:.80} ({type(value).__name__}) is not a signed 64-bit integer "
        f"(-2**63 <= x < 2**63); nothing was applied"
    )
    return InvalidIdError(msg)


def check_id(value: object, where: str, what: str = "source record id") -> int:
    """``value`` as an int if it is a signed 64-bit integer, else :class:`InvalidIdError`."""
    if not _is_i64(value):
        raise bad_id_error(what, where, value)
    return operator.index(value)  # type: ignore[arg-type]


def _diagnose(pairs: Iterable[Any], where: str) -> InvalidIdError:
    """Find the first bad (id, delta) pair; called only once packing has failed (slow path)."""
    for pair in pairs:
        try:
            sid, value = pair
        except (TypeError, ValueError):
            return InvalidIdError(
                f"{where}: {pair!r:.80} is not an (id, delta) pair; nothing was applied"
            )
        if not _is_i64(sid):
            return bad_id_error("source record id", where, sid)
        if not _is_i64(value):
            return bad_id_error(f"delta for id {sid}", where, value)
    return InvalidIdError(f"{where}: deltas could not be packed; nothing was applied")


def check_pairs(pairs: Sequence[Any], where: str) -> None:
    """Raise the error :func:`_diagnose` names if any (id, delta) pair is not two signed 64-bit ints
    (a caller that splits a flush over shards checks the whole flush before it sends any part)."""
    for pair in pairs:
        try:
            sid, value = pair
        except (TypeError, ValueError):
            raise _diagnose([pair], where) from None
        if not (_is_i64(sid) and _is_i64(value)):
            raise _diagnose([pair], where)


def checked_fails(fails: Mapping[int, str] | None, where: str) -> dict[int, str]:
    """``fails`` checked whole (ids signed 64-bit, reasons str), as a dict; InvalidArgumentError else."""
    return _checked_fails(fails, where)


def _checked_fails(fails: Mapping[int, str] | None, where: str) -> dict[int, str]:
    if fails is None:
        return {}
    if not isinstance(fails, Mapping):
        msg = f"{where}: fails must be a mapping of source record id to reason, got {type(fails).__name__}"
        raise InvalidArgumentError(msg)
    for sid, reason in fails.items():
        check_id(sid, where)
        if not isinstance(reason, str):
            msg = f"{where}: fail reason for id {sid} must be a str, got {type(reason).__name__}; nothing was applied"
            raise InvalidArgumentError(msg)
    return dict(fails)


class AckerTable:
    """XOR ack values of one source's pending records (see the module contract)."""

    def __init__(self, store: SourceStore) -> None:
        self.store = store
        self.token_ttl_ms = store.token_ttl_ms()

    def xor(
        self,
        deltas: Mapping[int, int] | Iterable[tuple[int, int]] | DeltaArrays,
        *,
        token: str | FlushToken | None = None,
        fails: Mapping[int, str] | None = None,
        no_replay: Collection[int] = (),
    ) -> FlushResult:
        """Apply XOR deltas (and explicit fails first) for this source; see module contract.

        Failed ids in ``no_replay`` are due at once and dead-lettered by the
        replayer without a replay (``FailRecord(..., replay=False)``, corrupt frames).

        ``deltas`` may repeat an id; repeats are combined first. Batches larger
        than ``flush_batch_size`` (or ``script_bounds.FLUSH_MAX_RECORDS``) go in several calls, each with the token
        suffixed by its chunk number (chunks are deterministic: sorted by id).
        """
        where = f"flush of source {self.store.keys.prefix!r}"
        fail_map = _checked_fails(fails, where)
        if not isinstance(deltas, (Mapping, list, tuple, DeltaArrays)):
            try:  # an iterator is read once here, so a bad pair can still be named below
                deltas = list(deltas)
            except TypeError as exc:
                msg = f"{where}: deltas must be a mapping or pairs of (id, delta), got {type(deltas).__name__}"
                raise InvalidIdError(msg) from exc
        packed = self._packed(deltas, where)
        if not packed and not fail_map:
            return FlushResult()
        packed = packed or [b""]  # fails alone still go in one call
        chunks = len(packed)
        packed_fails = pack_fails(fail_map, no_replay)
        # Only now, with every chunk packed and checked, does the first one go out.
        result = FlushResult()
        for i, blob in enumerate(packed):
            chunk_token = None
            if token is not None:
                whole = as_token(token)
                chunk_token = whole if chunks == 1 else FlushToken(whole.batch, f"{whole.task}#{i}")
            result = result.merge(self._flush(blob, packed_fails if i == 0 else b"", chunk_token))
        return result

    def ack(self, current_ids: Mapping[int, int], *, token: str | FlushToken | None = None) -> FlushResult:
        """Ack records: ``{source_record_id: current_record_id}`` XORed out (a sink's ack)."""
        return self.xor(current_ids, token=token)

    def complete(self, deltas: Mapping[int, int] | DeltaArrays) -> FlushResult:
        """Apply only the deltas that complete their record; leave every other record untouched.

        ``acked`` lists the ids this call completed; a delta not applied (its record's tree is
        still open elsewhere) is the caller's to send later with a token. Needs no token: an
        applied delta deletes its record, so repeating the call (a client retry, a task retry
        that re-sends it) finds the id no longer pending and changes nothing (counted late).
        Bad input is refused whole, as for :meth:`xor`.
        """
        result = FlushResult()
        for blob in self._packed(deltas, f"completing flush of source {self.store.keys.prefix!r}"):
            result = result.merge(self._flush(blob, b"", None, completing_only=True))
        return result

    def _packed(self, deltas: Mapping[int, int] | list[Any] | tuple[Any, ...] | DeltaArrays, where: str) -> list[bytes]:
        """Deltas combined per id (zeros dropped), sorted and packed in chunks of at most
        ``min(flush_batch_size, FLUSH_MAX_RECORDS)`` (bounded Lua time per call); none if empty.
        Every chunk is packed before any is sent: struct refuses an id or delta that is no
        int64, and :class:`InvalidIdError` then names the first bad pair (nothing applied)."""
        size = min(self.store.config.flush_batch_size, FLUSH_MAX_RECORDS)
        if isinstance(deltas, DeltaArrays):  # combined, sorted and int64 already
            return deltas.chunks(size)
        try:
            if isinstance(deltas, Mapping):
                combined = {sid: v for sid, v in deltas.items() if v or not isinstance(v, int)}
            else:
                combined = combine_deltas(deltas)
            sids = sorted(combined)
            return [pack_deltas({sid: combined[sid] for sid in sids[i : i + size]})
                    for i in range(0, len(sids), size)]
        except (TypeError, ValueError, struct.error) as exc:
            raise _diagnose(deltas.items() if isinstance(deltas, Mapping) else deltas, where) from exc

    def pending_of(self, source_record_ids: Sequence[int]) -> list[bool]:
        """For each id, whether its record is still pending (neither completed nor failed).

        Read-only; one call per ``FLUSH_MAX_RECORDS`` ids. A task retry uses it to skip records
        that an earlier attempt already brought to completion (or that failed and will replay).
        """
        where = f"pending check of source {self.store.keys.prefix!r}"
        ids = [check_id(sid, where) for sid in source_record_ids]
        out: list[bool] = []
        for i in range(0, len(ids), FLUSH_MAX_RECORDS):
            reply = self.store.run(PENDING, [self.store.keys.chunks],
                                   [self.store.keys.prefix, pack_ids(ids[i : i + FLUSH_MAX_RECORDS])])
            out.extend(b == ord("1") for b in (reply or b""))
        return out

    def _flush(self, deltas: bytes, fails: bytes, token: FlushToken | None, *,
               completing_only: bool = False) -> FlushResult:
        store = self.store
        keys = [*store.state_keys, store.keys.token(token.batch if token else "-")]
        args = [
            store.keys.prefix,
            "1" if token is not None else "0",
            self.token_ttl_ms,
            deltas,
            fails,
            store.now_ms(),
            *store.backoff_args(),
            token.task if token else "-",
            "1" if completing_only else "0",
        ]
        if fails:  # a fail of a record whose timeout came first marks it in rpl (see FLUSH)
            keys.append(store.keys.replaced)
            args.append(REPLACED_LINK_TTL_S * 1000)
        applied, others, late, failed = store.run(FLUSH, keys, args)
        acked: list[int] = []
        if applied and deltas:  # every delta completed its record but those listed in `others`
            sids = struct.unpack(f">{len(deltas) // 8}q", deltas)[0::2]
            if others:
                skip = {pos for pos, _status in _OTHER.iter_unpack(others)}
                acked = [sid for j, sid in enumerate(sids) if j not in skip]
            else:
                acked = list(sids)
        return FlushResult(bool(applied), acked, int(late), int(failed))

    def value(self, source_record_id: int) -> int | None:
        """Current ack value of a pending id (None if not pending). For tests and inspection."""
        sid = check_id(source_record_id, f"value of source {self.store.keys.prefix!r}")
        k = self.store.keys
        key, index = chunk_key(sid), index_of(sid)
        pipe = self.store.client.pipeline(transaction=False)
        pipe.hget(k.chunks, key)
        pipe.hget(k.partials, struct.pack(">q", sid))
        pipe.hget(k.chunk_acks, key)
        state, partial, acks = pipe.execute()
        if state is None or not ChunkState.parse(state).pending(index):
            return None
        raw = partial if partial is not None else acks[8 * index : 8 * index + 8]
        return int(struct.unpack(">q", raw)[0])

    def pending_count(self) -> int:
        """Source records persisted and neither completed nor failed."""
        return int(self.store.client.get(self.store.keys.live) or 0)

"""AckerTable: source_record_id -> 64-bit XOR ack value, kept in Redis.

A source record's tree is complete when its ack value returns to 0 for the
first time: every record id in the tree has been XORed in once (when emitted)
and out once (when acked). Contract of :meth:`AckerTable.xor`:

- **Atomic and exact.** All deltas of one call are applied in one server-side
  script, with exact 64-bit XOR (two 32-bit halves in Lua).
- **First zero only.** The ids returned as acked reached 0 in this call. The
  same call deletes the record's persisted frame and bucket entry, so an id is
  reported acked at most once.
- **Late deltas are ignored.** A delta for an id that is no longer pending
  (completed, or failed and handed to the replayer) changes nothing and is
  counted as late. A late ack never resurrects a record.
- **Idempotent per token.** A call with a flush token that was already applied
  is skipped whole and reports ``applied=False``. Tokens expire after
  ``token_ttl_ms``; a delta applied twice after that cancels itself out (XOR is
  an involution), which can only delay completion into a timeout and replay,
  never complete a record early or lose it.
- **Order-free.** Deltas commute: flushes of different tasks may land in any
  order.

Cost: one round trip per ``flush_batch_size`` deltas; server work O(deltas).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from ftlayer.store import SourceStore, unpack_ids

MAX_REASON_BYTES = 8192
NO_REPLAY_FLAG = 0x8000  # top bit of a fail's reason length (reasons are < 2**15 bytes): dead-letter at once


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


class AckerTable:
    """XOR ack values of one source's pending records (see the module contract)."""

    def __init__(self, store: SourceStore) -> None:
        self.store = store
        cfg = store.config
        # A token must outlive every retry of its flush while the record can still be
        # pending: at most timeout * n/(n-1), plus replay time; keep a wide margin.
        self.token_ttl_ms = int(max(3600.0, 4 * cfg.timeout_s * cfg.num_buckets) * 1000)

    def xor(
        self,
        deltas: Mapping[int, int] | Iterable[tuple[int, int]],
        *,
        token: str | None = None,
        fails: Mapping[int, str] | None = None,
        no_replay: Collection[int] = (),
    ) -> FlushResult:
        """Apply XOR deltas (and explicit fails first) for this source; see module contract.

        Failed ids in ``no_replay`` are due at once and dead-lettered by the
        replayer without a replay (``FailRecord(..., replay=False)``, corrupt frames).

        ``deltas`` may repeat an id; repeats are combined first. Batches larger
        than ``flush_batch_size`` go in several calls, each with the token
        suffixed by its chunk number (chunks are deterministic: sorted by id).
        """
        combined = dict(deltas) if isinstance(deltas, Mapping) else combine_deltas(deltas)
        if isinstance(deltas, Mapping):
            combined = {sid: v for sid, v in combined.items() if v}
        fail_map = dict(fails or {})
        if not combined and not fail_map:
            return FlushResult()
        size = self.store.config.flush_batch_size
        sids = sorted(combined)
        chunks = max(1, math.ceil(len(sids) / size))
        result = FlushResult()
        for i in range(chunks):
            part = {sid: combined[sid] for sid in sids[i * size : (i + 1) * size]}
            chunk_token = None if token is None else (token if chunks == 1 else f"{token}#{i}")
            result = result.merge(self._flush(part, fail_map if i == 0 else {}, chunk_token, no_replay))
        return result

    def ack(self, current_ids: Mapping[int, int], *, token: str | None = None) -> FlushResult:
        """Ack records: ``{source_record_id: current_record_id}`` XORed out (a sink's ack)."""
        return self.xor(current_ids, token=token)

    def _flush(
        self, deltas: Mapping[int, int], fails: Mapping[int, str], token: str | None, no_replay: Collection[int] = ()
    ) -> FlushResult:
        store = self.store
        keys = [*store.state_keys, store.keys.token(token or "-")]
        args = [
            store.keys.prefix,
            "1" if token is not None else "0",
            self.token_ttl_ms,
            pack_deltas(deltas),
            pack_fails(fails, no_replay),
            store.now_ms(),
            *store.backoff_args(),
        ]
        applied, acked_blob, late, failed = store.run("FLUSH", keys, args)
        return FlushResult(bool(applied), unpack_ids(acked_blob or b""), int(late), int(failed))

    def value(self, source_record_id: int) -> int | None:
        """Current ack value of a pending id (None if not pending). For tests and inspection."""
        raw: bytes | None = self.store.client.hget(self.store.keys.pend, struct.pack(">q", source_record_id))  # type: ignore[assignment]
        if raw is None:
            return None
        return int(struct.unpack(">q", raw[:8])[0])

    def pending_count(self) -> int:
        """Source records persisted and neither completed nor failed."""
        return int(self.store.client.hlen(self.store.keys.pend))

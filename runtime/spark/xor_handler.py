"""The XOR accumulator of one task: combined deltas and fails per source record, flushed together.

Part of the FT handler (``runtime.spark.handlers``): operators put their deltas
on their outputs, the sink combines everything its task received here and sends
it to the acker, completing records as it goes (:meth:`XorHandler.flush_completing`)
and the rest once at the end of the task with an idempotent token
(:meth:`XorHandler.flush`). Fails are kept apart: the first fail of an id in a
task decides its reason and whether it is replayed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ftlayer.acker.acker_table import FlushResult
from ftlayer.acker.flush_tokens import FlushToken
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.delta_arrays import DeltaArrays

__all__ = ["DUPLICATE_FLUSH_ENV", "DUPLICATE_FLUSH_PROPERTY", "XorHandler", "duplicate_flushes"]

DUPLICATE_FLUSH_ENV = "FTLAYER_CHAOS_DUPLICATE_FLUSH"
DUPLICATE_FLUSH_PROPERTY = "ftlayer.chaos.duplicateFlush"


def duplicate_flushes() -> bool:
    """True when the duplicated-flush fault is switched on for this process or task (fault
    injection for tests and ``ftlayer chaos``; see ``runtime.spark.handlers``)."""
    if os.environ.get(DUPLICATE_FLUSH_ENV) == "1":
        return True
    try:
        from pyspark import TaskContext
    except ImportError:  # no Spark here: only the environment switch applies
        return False
    tc = TaskContext.get()
    return tc is not None and tc.getLocalProperty(DUPLICATE_FLUSH_PROPERTY) == "1"


class XorHandler:
    """Per-task XOR accumulator: combined deltas and fails per (source index, source record id).

    Deltas are kept as arrays (:class:`~ftlayer.records.delta_arrays.DeltaArrays` per source index):
    :meth:`xor_many` appends a batch's, and they are combined (sorted by id, XORed per id,
    zeros dropped) when they are sent or read. ``fails`` maps source index -> {id: reason}
    (the first fail of an id in a task decides its reason); ``no_replay`` holds the failed
    ids to dead-letter at once.
    """

    def __init__(self) -> None:
        self._parts: dict[int, list[DeltaArrays]] = {}
        self.fails: dict[int, dict[int, str]] = {}
        self.no_replay: dict[int, set[int]] = {}

    def xor(self, src: int, sid: int, value: int) -> None:
        """XOR ``value`` into record ``sid`` of source ``src``."""
        self.xor_many([src], [sid], [value])

    def xor_many(self, src: Any, sid: Any, values: Any) -> None:
        """:meth:`xor` for every ``(src[i], sid[i], values[i])`` (arrays or lists of one length)."""
        import numpy as np

        src = np.asarray(src, dtype=np.int64)
        if src.size == 0:
            return
        sid, values = np.asarray(sid, dtype=np.int64), np.asarray(values, dtype=np.int64)
        first = int(src[0])
        sources = [first] if bool((src == first).all()) else np.unique(src).tolist()
        for s in sources:
            at = slice(None) if len(sources) == 1 else src == s
            self._parts.setdefault(s, []).append(DeltaArrays(sid[at], values[at]))

    def combined(self, src: int) -> DeltaArrays:
        """The deltas of source ``src`` so far, combined per id (none zero)."""
        import numpy as np

        parts = self._parts.get(src)
        if not parts:
            return DeltaArrays.combine([], [])
        if len(parts) == 1 and _is_combined(parts[0]):
            return parts[0]
        merged = DeltaArrays.combine(np.concatenate([p.sids for p in parts]), np.concatenate([p.values for p in parts]))
        self._parts[src] = [merged]
        return merged

    @property
    def deltas(self) -> dict[int, dict[int, int]]:
        """The combined deltas as ``{src: {sid: delta}}`` (a copy, for inspection)."""
        return {src: dict(self.combined(src).items()) for src in list(self._parts)}

    def flush_completing(self, layers: Mapping[int, FTLayer], src: Any, sid: Any) -> int:
        """Send the combined delta of each record ``(src[i], sid[i])`` (the rows written since the
        last call), to be applied only where it completes the record (:meth:`FTLayer.complete`);
        forget those that completed, keep the rest for a later flush. Returns how many completed.

        Safe without a token: a completing delta deletes its record, so sending it again (a
        retry of this call, a retried task) changes nothing; a delta that does not complete is
        never applied here, so it cannot be applied twice. Ids this task failed are left for
        :meth:`flush` (their fail goes first there).
        """
        import numpy as np

        src, sid = np.asarray(src, dtype=np.int64), np.asarray(sid, dtype=np.int64)
        completed = 0
        for s in np.unique(src).tolist():
            merged = self.combined(s)
            send = merged.having(sid[src == s])
            failed = self.fails.get(s)
            if failed:
                send &= ~merged.having(np.fromiter(failed, dtype=np.int64, count=len(failed)))
            if not send.any():
                continue
            acked = layers[s].complete(merged.take(send)).acked
            if acked:
                self._parts[s] = [merged.take(~merged.having(acked))]
                completed += len(acked)
        return completed

    def fail(self, src: int, sid: int, reason: str, *, replay: bool = True) -> None:
        per = self.fails.setdefault(src, {})
        if sid in per:
            return
        per[sid] = reason
        if not replay:
            self.no_replay.setdefault(src, set()).add(sid)

    def empty(self) -> bool:
        return not any(len(self.combined(src)) for src in list(self._parts)) and not any(self.fails.values())

    def flush(self, layers: Mapping[int, FTLayer], token: str | FlushToken) -> dict[int, FlushResult]:
        """Send everything accumulated, one call per source, then reset. Idempotent per token.

        With :func:`duplicate_flushes` on, each call is sent a second time with the same
        token (fault injection); the first call's result is returned.
        """
        out: dict[int, FlushResult] = {}
        twice = duplicate_flushes()
        for src in sorted(set(self._parts) | set(self.fails)):
            deltas = self.combined(src)
            fails = self.fails.get(src, {})
            if len(deltas) or fails:
                final = self.no_replay.get(src, set())
                part = token.child(f"s{src}") if isinstance(token, FlushToken) else f"{token}/s{src}"
                out[src] = layers[src].xor(deltas, token=part, fails=fails, no_replay=final)
                if twice:
                    layers[src].xor(deltas, token=part, fails=fails, no_replay=final)
        self._parts.clear()
        self.fails.clear()
        self.no_replay.clear()
        return out


def _is_combined(part: DeltaArrays) -> bool:
    """Whether ``part`` already is combined: ids strictly increasing, no zero delta."""
    import numpy as np

    return bool((part.values != 0).all() and (np.diff(part.sids) > 0).all())

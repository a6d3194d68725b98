"""RecordId and fork-safe 64-bit id generation; pure functions for XOR math.

Ids are *signed* 64-bit integers in ``[-2**63, 2**63)`` and never 0. Signed is
deliberate: it is Spark's ``LongType`` and Arrow's ``int64``, and the set of
signed 64-bit integers is closed under Python's ``^`` (both operands
sign-extend the same way), so XOR of ids needs no masking.

Fork safety: PySpark forks its Python workers from a daemon. A generator seeded
before the fork would hand every worker the same sequence and collide ids
across workers. The module generator is re-seeded from ``os.urandom`` in every
child (``os.register_at_fork``) and additionally checks the pid on each call,
which also covers ``multiprocessing`` start methods that bypass the fork hook.
"""

from __future__ import annotations

import os
import random
import struct
import threading
from typing import Any, NamedTuple

import xxhash

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63
_CHILD_SEED = 0x5EED_F7  # any fixed value; child ids must be reproducible across processes


def to_signed64(value: int) -> int:
    """Read the low 64 bits of ``value`` as a two's-complement signed integer."""
    value &= _MASK64
    return value - (1 << 64) if value & _SIGN64 else value


def to_unsigned64(value: int) -> int:
    """Read a signed 64-bit integer as unsigned (the bit pattern is unchanged)."""
    return value & _MASK64


class RecordId(NamedTuple):
    """Identity of one record in a source record's tree.

    ``source_record_id`` names the tree (the acker entry); ``current_record_id``
    names this record within it. A source record's own ids are both fresh; every
    derived record keeps its parent's source_record_id and gets a new current id.
    """

    source_record_id: int
    current_record_id: int


class IdGenerator:
    """Random nonzero signed 64-bit ids, safe across ``fork``.

    Thread-safe. Each process draws from its own stream seeded from
    ``os.urandom``; a pid change (fork) reseeds before the next draw. The
    chance that two of N ids collide is about N**2 / 2**65.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._rng = random.Random()
        self._reseed()

    def _reseed(self) -> None:
        self._rng.seed(os.urandom(32))
        self._pid = os.getpid()

    def after_fork(self) -> None:
        """Reseed in a forked child; registered with ``os.register_at_fork``."""
        self._lock = threading.Lock()
        self._reseed()

    def next_id(self) -> int:
        """One new nonzero signed 64-bit id."""
        with self._lock:
            if os.getpid() != self._pid:
                self._reseed()
            while True:
                value = to_signed64(self._rng.getrandbits(64))
                if value:
                    return value

    def next_ids(self, count: int) -> list[int]:
        """``count`` new nonzero ids in one call (one lock, one pid check)."""
        with self._lock:
            if os.getpid() != self._pid:
                self._reseed()
            raw = self._rng.getrandbits(64 * count) if count else 0
        # one conversion to bytes and one unpack: shifting the big integer per id was quadratic
        values = struct.unpack(f"<{count}q", raw.to_bytes(8 * count, "little"))
        return [v if v else self.next_id() for v in values]


    def next_id_array(self, count: int) -> Any:
        """:meth:`next_ids` as a numpy ``int64`` array (ingest's batches): no Python int per id."""
        import numpy as np

        with self._lock:
            if os.getpid() != self._pid:
                self._reseed()
            raw = self._rng.getrandbits(64 * count) if count else 0
        values = np.frombuffer(raw.to_bytes(8 * count, "little"), dtype="<i8").astype(np.int64)
        for at in np.flatnonzero(values == 0).tolist():  # 2**-64 per id: drawn again, as next_ids does
            values[at] = self.next_id()
        return values


_GENERATOR = IdGenerator()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_GENERATOR.after_fork)


def new_ids(count: int) -> list[int]:
    """``count`` fresh ids from the process-wide generator."""
    return _GENERATOR.next_ids(count)


def new_id_array(count: int) -> Any:
    """``count`` fresh ids from the process-wide generator, as a numpy ``int64`` array."""
    return _GENERATOR.next_id_array(count)


_INDEX_CLEAR = -1 << 16  # ftlayer.records.chunks: the low 16 bits of a source record id are its index in its chunk


def new_record_id() -> RecordId:
    """A RecordId for a new source record (both halves fresh and independent).

    The source record id is index 0 of a fresh random chunk (``ftlayer.records.chunks``), so
    a record built alone is persisted as a chunk of its own.
    """
    sid, cid = _GENERATOR.next_ids(2)
    return RecordId((sid & _INDEX_CLEAR) or (1 << 16), cid)


_CHILD = struct.Struct("<qqI")
_CHILD_PACK = _CHILD.pack
_xxh64 = xxhash.xxh64_intdigest


def child_id(parent_current_id: int, operator_id: int, output_index: int) -> int:
    """Deterministic current id for output ``output_index`` of ``operator_id`` on a parent.

    Pure: the same inputs give the same id in every process, so a retried Spark
    task XORs exactly the same ids as the attempt it replaces. Never 0.
    """
    # hot path (once per operator output): to_signed64 inlined; the digest is already 64-bit
    value = _xxh64(_CHILD_PACK(parent_current_id, operator_id, output_index), _CHILD_SEED)
    if value >= _SIGN64:
        return value - (1 << 64)
    return value if value else 1


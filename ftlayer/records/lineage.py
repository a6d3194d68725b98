"""Lineage ids: one id per output, the same on every replay of its source record.

A replay gets a new source record id (so late acks of the failed attempt do nothing) but keeps
its origin id and its root *current* id (``ftlayer.acker.replayer``). Every id derived below the root
is ``child_id(parent, operator, index)``, a pure function, so each output of a record's tree has
the same current id on every attempt: after a replay, a task retry and a restart alike.

The lineage id of an output is its origin id and its current id, each as 16 lowercase hex
digits of the unsigned bit pattern: 32 characters, for example
``"00a1b2c3d4e5f60100000000deadbeef"``. Contract:

- **stable**: the same output of the same source record has the same lineage id on every
  attempt (first run, replays, Spark task retries, driver restarts);
- **unique**: two different outputs of one record differ (different paths through the tree
  give different child ids, up to a 64-bit hash collision), and outputs of different records
  differ (their origin ids differ while both are in flight, and the 64-bit random root current
  id separates a record from any later one whose origin reuses a retired chunk id: about
  ``N**2 / 2**113`` for N records);
- **opaque**: compare it for equality, use it as a unique key; do not parse it.

On the DataFrame path a row's ``_ftlayer.lineage`` is the lineage id of its source record
(the root). A plan that makes several rows from one record (``explode``, a join that matches
twice) must add the row's position itself (``posexplode``) if the sink keys on the id.
On the Topology path ``SinkContext.lineages`` holds one id per value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["LINEAGE_CHARS", "lineage_hex", "lineage_id", "lineage_ids"]

LINEAGE_CHARS = 32
_MASK64 = (1 << 64) - 1


def lineage_id(origin: int, current: int) -> str:
    """The lineage id of the output with current id ``current`` in the tree of ``origin``."""
    return f"{origin & _MASK64:016x}{current & _MASK64:016x}"


def lineage_hex(origins: Sequence[int] | np.ndarray, currents: Sequence[int] | np.ndarray) -> bytes:
    """The lineage ids of two aligned columns as one ASCII buffer, :data:`LINEAGE_CHARS` bytes
    per row with no separator (an Arrow string column's data buffer as is), encoded in one pass."""
    o = np.asarray(origins, dtype=np.int64)
    c = np.asarray(currents, dtype=np.int64)
    if o.shape != c.shape or o.ndim != 1:
        msg = f"origins and current ids must be aligned 1-d columns: {o.shape} vs {c.shape}"
        raise ValueError(msg)
    pairs = np.empty((len(o), 2), dtype=">u8")
    pairs[:, 0] = o.view(np.uint64)
    pairs[:, 1] = c.view(np.uint64)
    return pairs.tobytes().hex().encode("ascii")


def lineage_ids(origins: Sequence[int] | np.ndarray, currents: Sequence[int] | np.ndarray) -> list[str]:
    """:func:`lineage_id` over two aligned columns."""
    text = lineage_hex(origins, currents).decode("ascii")
    return [text[i:i + LINEAGE_CHARS] for i in range(0, len(text), LINEAGE_CHARS)]

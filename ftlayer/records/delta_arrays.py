"""A task's combined XOR deltas as arrays: sent to the acker without a Python object per record.

numpy is imported when a method runs, not with this module, so the FT core
(``ftlayer.acker.acker_table``) can recognise the type without importing numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DeltaArrays"]


@dataclass(frozen=True)
class DeltaArrays:
    """XOR deltas of distinct source record ids as two int64 arrays, sorted by id, none zero.

    What a task has combined per record, in the form the acker sends without a Python
    object per record: :meth:`AckerTable.xor <ftlayer.acker.acker_table.AckerTable.xor>` and
    ``complete`` (and ``FTLayer``'s) take it wherever they take a ``{sid: delta}`` mapping,
    with the same effect. Build it with :meth:`combine`.
    """

    sids: Any
    values: Any

    def __len__(self) -> int:
        return int(self.sids.size)

    @classmethod
    def combine(cls, sids: Any, values: Any) -> DeltaArrays:
        """``values`` XOR-combined per id of ``sids`` (an id may repeat), ids whose delta is 0 dropped."""
        import numpy as np

        from ftlayer.records.id_arrays import xor_by_group

        sids = np.asarray(sids, dtype=np.int64)
        values = np.asarray(values, dtype=np.int64)
        if sids.size == 0:
            return cls(sids, values)
        order = np.argsort(sids, kind="stable")  # runs already sorted (earlier combines) merge in linear time
        sids, values = sids[order], values[order]
        starts = np.flatnonzero(np.concatenate(([True], sids[1:] != sids[:-1])))
        combined = xor_by_group(values, starts)
        keep = combined != 0
        return cls(sids[starts][keep], combined[keep])

    def having(self, ids: Any) -> Any:
        """A boolean mask over :attr:`sids`: which of them are among ``ids`` (any order, repeats
        allowed). ``np.isin``'s result, found by binary search in the sorted ids (no sort of both
        arrays together: a task's sink calls this for every write it completes)."""
        import numpy as np

        mask = np.zeros(self.sids.size, dtype=bool)
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and self.sids.size:
            at = np.searchsorted(self.sids, ids)
            inside = at < self.sids.size
            at, ids = at[inside], ids[inside]
            mask[at[self.sids[at] == ids]] = True
        return mask

    def take(self, mask: Any) -> DeltaArrays:
        """The deltas where ``mask`` (a boolean array over the ids) is true."""
        return DeltaArrays(self.sids[mask], self.values[mask])

    def items(self) -> list[tuple[int, int]]:
        """``(sid, delta)`` pairs as Python ints, by id."""
        return list(zip(self.sids.tolist(), self.values.tolist(), strict=True))

    def chunks(self, size: int) -> list[bytes]:
        """The deltas packed as ``ftlayer.acker.acker_table.pack_deltas`` packs them (big-endian
        ``[sid 8][value 8]`` pairs, by id), in chunks of at most ``size`` ids; none if empty."""
        import numpy as np

        out = []
        for at in range(0, len(self), size):
            pairs = np.empty((min(size, len(self) - at), 2), dtype=">i8")
            pairs[:, 0] = self.sids[at : at + size]
            pairs[:, 1] = self.values[at : at + size]
            out.append(pairs.tobytes())
        return out

    def by_shard(self, num_shards: int) -> dict[int, DeltaArrays]:
        """The deltas split per virtual shard (``ftlayer.records.chunks.shard_of``: the id's top byte mod N)."""
        import numpy as np

        shard = ((self.sids >> 56) & 0xFF) % num_shards
        return {int(k): self.take(shard == k) for k in np.unique(shard).tolist()}

"""Virtual shards of a source: hash tags chosen so a source spreads evenly over a cluster.

A Redis Cluster places a key by the CRC16 of its hash tag (the text between the
first ``{`` and the next ``}``) modulo 16384 slots, and each primary serves some
slot ranges. Today every key of a source shares one tag (``{<topology>/<source>}``,
see :mod:`ftlayer.keyspace.keys`), so a source lives on one slot of one primary. To scale
out, a source is split into ``num_shards`` virtual shards, each with its own tag.

:class:`~ftlayer.facade.ft_layer.FTLayer` (through ``ftlayer.facade.shard``) keeps a source with
``num_shards`` N in these N shards; this module chooses their tags and routes ids.

Why tags are chosen, not named: naive names (``src/0`` ... ``src/15``) hash to
arbitrary slots, and 16 of them landed 7/6/3 on 3 primaries. Here shard ``i`` of
``N`` gets a *target slot*, the middle of the ``i``-th of ``N`` equal slices of
the slot space, and its tag is the first candidate ``<base>/<i>.<k>``
(``k = 0, 1, ...``) whose slot lies within a small window around that target.
The table of target slots, not the names, fixes the spread.

Contract:
- **Even.** For every ``P`` in ``1..N`` primaries holding equal contiguous slot
  ranges (:func:`slot_ranges`, or redis-cli's assignment, which differs by at
  most one slot per boundary), each primary holds ``floor(N/P)`` or
  ``ceil(N/P)`` of the ``N`` shards. Why: the targets are ``N`` evenly spaced
  points, any range of length ``16384/P`` holds ``floor`` or ``ceil`` of ``N/P``
  of them, and the window (``16384 // (2*N*N) - 2`` slots either side) is
  narrower than the distance from any target to any boundary, minus one slot.
- **Deterministic.** Tags depend only on ``base`` and ``N``: the same in every
  process, Python version and restart (CRC16 and string formatting, no seeds).
  They are part of the data's layout in Redis: changing this algorithm re-keys
  every source and needs a format version bump.
- **Distinct sources, distinct slots (mostly).** ``base`` is part of every
  candidate, so two sources' shard ``i`` usually land on different slots of the
  same window, and a resharding can move them apart.
- **Routing.** ``ftlayer.records.chunks.shard_of`` maps an id to a shard by its top byte
  modulo N: every record of a chunk shares its shard, and
  ftlayer draws the ids of a replay or a requeue in the shard of the failed
  record, so a record, its replays and its requeues (which keep the origin id)
  always stay in the origin's shard. Ids ftlayer draws at random spread evenly
  (for N dividing 256 exactly; otherwise within 1/256).
- Cost: choosing the tags tries about ``16384 / (2*window+1)`` candidates per
  shard (about 270 for ``N = 16``); results are cached per ``(base, N)``.
"""

from __future__ import annotations

import functools

import xxhash
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ftlayer.errors import ConfigError, InvalidArgumentError

__all__ = [
    "DEFAULT_NUM_SHARDS",
    "MAX_NUM_SHARDS",
    "SLOTS",
    "key_slot_of",
    "shard_tags",
    "slot_ranges",
    "target_slot",
]

SLOTS = REDIS_CLUSTER_HASH_SLOTS  # 16384
DEFAULT_NUM_SHARDS = 16
MAX_NUM_SHARDS = 64  # beyond it the window is under one slot and evenness is no longer guaranteed
_MAX_CANDIDATES = 1_000_000


def key_slot_of(key: str | bytes) -> int:
    """The Redis Cluster slot of ``key`` (CRC16-XMODEM mod 16384 of its hash tag), as CLUSTER KEYSLOT."""
    return key_slot(key.encode() if isinstance(key, str) else key)


def slot_ranges(primaries: int) -> tuple[tuple[int, int], ...]:
    """Equal contiguous inclusive slot ranges for ``primaries`` primaries, in slot order."""
    if not 1 <= primaries <= SLOTS:
        msg = f"primaries must be in 1..{SLOTS}, got {primaries}"
        raise InvalidArgumentError(msg)
    return tuple((j * SLOTS // primaries, (j + 1) * SLOTS // primaries - 1) for j in range(primaries))


def _check_num_shards(num_shards: int) -> int:
    if type(num_shards) is not int or not 1 <= num_shards <= MAX_NUM_SHARDS:
        msg = f"num_shards must be an int in 1..{MAX_NUM_SHARDS}, got {num_shards!r}"
        raise ConfigError(msg)
    return num_shards


def target_slot(shard: int, num_shards: int) -> int:
    """The slot in the middle of the ``shard``-th of ``num_shards`` equal slices of the slot space."""
    return ((2 * shard + 1) * SLOTS) // (2 * num_shards)


def _window(num_shards: int) -> int:
    return max(0, SLOTS // (2 * num_shards * num_shards) - 2)


def shard_tags(base: str, num_shards: int = DEFAULT_NUM_SHARDS) -> tuple[str, ...]:
    """The hash tag of each of ``num_shards`` shards of ``base`` (e.g. ``"topo/source"``), braces excluded."""
    _check_num_shards(num_shards)  # before the cache, whose key would take 2.0 for 2
    if type(base) is not str or not base or "{" in base or "}" in base:
        msg = f"shard tag base must be a non-empty str without braces, got {base!r}"
        raise InvalidArgumentError(msg)
    return _choose_tags(base, num_shards)


@functools.lru_cache(maxsize=1024)
def _choose_tags(base: str, num_shards: int) -> tuple[str, ...]:
    window = _window(num_shards)
    # CRC16 is linear: candidates of two bases that differ in one character, counted from the
    # same k, hit related slots. Starting each base's count at its own offset decorrelates them.
    start = xxhash.xxh64_intdigest(base.encode()) % 1_000_000
    tags = []
    for shard in range(num_shards):
        target = target_slot(shard, num_shards)
        for k in range(start, start + _MAX_CANDIDATES):
            tag = f"{base}/{shard}.{k}"
            if abs(key_slot(tag.encode()) - target) <= window:
                tags.append(tag)
                break
        else:  # CRC16 reaches every slot; this would mean a broken hash
            msg = f"no tag for shard {shard} of {base!r} within {window} slots of slot {target}"
            raise InvalidArgumentError(msg)
    return tuple(tags)

"""Virtual shards: even spread over primaries, determinism, routing by id (pure; no server)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.errors import ConfigError, InvalidArgumentError
from ftlayer.keyspace.shard_tags import MAX_NUM_SHARDS, SLOTS, _choose_tags, key_slot_of, shard_tags, slot_ranges
from ftlayer.records.chunks import INDEX_BITS, assign_sids, shard_of

names = st.from_regex(r"[A-Za-z0-9_.\-]{1,20}", fullmatch=True)
ids = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1).filter(lambda i: i != 0)


def spread(slots: list[int] | tuple[int, ...], ranges: tuple[tuple[int, int], ...]) -> list[int]:
    """How many of ``slots`` fall in each inclusive range (e.g. shards per primary)."""
    return [sum(1 for s in slots if first <= s <= last) for first, last in ranges]


def source_slots(source: str, num_shards: int = 16) -> list[int]:
    """The slot of each shard of ``topo/<source>`` (the tags ``ftlayer.keyspace.keys.SourceKeys`` uses)."""
    return [key_slot_of(t) for t in shard_tags(f"topo/{source}", num_shards)]


def redis_cli_slot_ranges(primaries: int) -> tuple[tuple[int, int], ...]:
    """redis-cli --cluster create's assignment (clusterManagerCommandCreate), for comparison."""
    per_node = SLOTS / primaries
    first, cursor, out = 0, 0.0, []
    for i in range(primaries):
        last = round(cursor + per_node - 1)
        if last > SLOTS or i == primaries - 1:
            last = SLOTS - 1
        last = max(last, first)
        out.append((first, last))
        first, cursor = last + 1, cursor + per_node
    return tuple(out)


def test_key_slot_matches_known_redis_values() -> None:
    # values from the Redis Cluster spec and CLUSTER KEYSLOT
    assert key_slot_of("foo") == 12182
    assert key_slot_of("{user1000}.following") == key_slot_of("{user1000}.followers")
    assert key_slot_of("foo{}{bar}") == key_slot_of("foo{}{bar}")  # empty tag: whole key hashed


def test_slot_ranges_cover_every_slot_once() -> None:
    for p in (1, 2, 3, 5, 7, 16):
        ranges = slot_ranges(p)
        assert ranges[0][0] == 0 and ranges[-1][1] == SLOTS - 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))


def test_default_tags_of_one_source_spread_5_6_5_over_3_primaries() -> None:
    counts = spread(source_slots("src"), slot_ranges(3))
    print(f"\nshard spread of topo/src (16 shards) over 3 primaries: {counts}")
    assert sorted(counts) == [5, 5, 6]


def test_naive_tag_names_spread_unevenly() -> None:
    # why tags are chosen: the names the chooser starts from, taken as they are, do not spread
    naive = [key_slot_of(f"topo/src/{i}") for i in range(16)]
    best = source_slots("src")
    assert max(spread(naive, slot_ranges(3))) - min(spread(naive, slot_ranges(3))) >= 2
    assert max(spread(best, slot_ranges(3))) - min(spread(best, slot_ranges(3))) <= 1


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(base=names, num_shards=st.integers(1, MAX_NUM_SHARDS), data=st.data())
def test_shards_spread_within_one_over_any_primary_count(base: str, num_shards: int, data: st.DataObject) -> None:
    slots = [key_slot_of(t) for t in shard_tags(base, num_shards)]
    assert len(set(shard_tags(base, num_shards))) == num_shards
    primaries = data.draw(st.integers(1, num_shards), label="primaries")
    for ranges in (slot_ranges(primaries), redis_cli_slot_ranges(primaries)):
        counts = spread(slots, ranges)
        assert sum(counts) == num_shards
        assert set(counts) <= {num_shards // primaries, -(-num_shards // primaries)}, (primaries, counts)


@settings(max_examples=50, deadline=None)
@given(base=names, num_shards=st.integers(1, 32))
def test_tags_are_deterministic_and_carry_no_braces(base: str, num_shards: int) -> None:
    _choose_tags.cache_clear()
    first = shard_tags(base, num_shards)
    _choose_tags.cache_clear()
    assert shard_tags(base, num_shards) == first
    assert all(t.startswith(base + "/") and "{" not in t and "}" not in t for t in first)


def test_tags_are_the_same_in_another_process() -> None:
    code = "from ftlayer.keyspace.shard_tags import shard_tags; print(','.join(shard_tags('topo/src', 16)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", **os.environ}).stdout.strip()
    assert out.split(",") == list(shard_tags("topo/src", 16))


def test_sources_share_slots_no_more_than_chance() -> None:
    # shard i of every source lands in the same window of 61 slots (N = 16); within it, a
    # source's slot must look random, not follow CRC16's linearity in the source's name
    maps = [source_slots(f"s{n}") for n in range(60)]
    same = sum(x == y for i, a in enumerate(maps) for b in maps[i + 1:] for x, y in zip(a, b, strict=True))
    by_chance = len(maps) * (len(maps) - 1) // 2 * 16 / 61
    assert same < 1.5 * by_chance, (same, by_chance)


@settings(max_examples=200, deadline=None)
@given(origin=ids, num_shards=st.integers(1, 32), index=st.integers(0, (1 << INDEX_BITS) - 1))
def test_every_record_of_a_chunk_is_in_one_shard(origin: int, num_shards: int, index: int) -> None:
    shard = shard_of(origin, num_shards)
    assert 0 <= shard < num_shards
    other = (origin >> INDEX_BITS << INDEX_BITS) | index  # another record of the same chunk
    assert shard_of(other, num_shards) == shard


@pytest.mark.parametrize("num_shards", [2, 3, 16, 64])
def test_ids_ftlayer_draws_spread_evenly_and_replays_are_drawn_in_their_shard(num_shards: int) -> None:
    counts = [0] * num_shards
    for sid in assign_sids([i % 4 for i in range(160_000)], max_records=10, num_shards=num_shards):
        counts[shard_of(sid, num_shards)] += 1
    expected = 160_000 / num_shards
    assert max(counts) < expected * 1.05 and min(counts) > expected * 0.95
    for shard in range(num_shards):  # a replay (or requeue) of a record of `shard` is drawn there
        assert {shard_of(s, num_shards) for s in assign_sids([0, 1] * 50, shard=shard, num_shards=num_shards)} == {
            shard}


@pytest.mark.parametrize("bad", [0, MAX_NUM_SHARDS + 1, 2.0])
def test_bad_shard_count_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="num_shards"):
        shard_tags("topo/src", bad)  # type: ignore[arg-type]


def test_a_bad_base_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="braces"):
        shard_tags("topo/{src}", 4)

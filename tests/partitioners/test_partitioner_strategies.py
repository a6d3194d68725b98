"""Live form vs replay form of every strategy, using only what is persisted (key_hash, channel)."""

from __future__ import annotations

import json
import os
import pickle
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftlayer.errors import FTLayerError, PartitioningError
from ftlayer.records.keyhash import key_hash
from partitioners import (
    STRATEGIES,
    FieldsPartitioner,
    GlobalPartitioner,
    Partitioner,
    PersistedRoute,
    RebalancePartitioner,
    ReplayPartitioner,
    ShufflePartitioner,
    partitioner_for,
    replay_partitioner_for,
)

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
CHANNELS = st.integers(min_value=1, max_value=300)
KEYS = st.one_of(st.text(), st.binary(), I64, st.booleans(), st.none())

# chi-square critical values for p = 0.001
CHI2_CRIT_P001 = {7: 24.322, 15: 37.697}


def _replayed(strategy: str, n: int) -> ReplayPartitioner:
    """A replay partitioner as the replayer gets it: a separate instance, shipped by pickle."""
    copy: ReplayPartitioner = pickle.loads(pickle.dumps(replay_partitioner_for(strategy, n)))
    return copy


def _chi_square(counts: Counter[int], n: int, total: int) -> float:
    expected = total / n
    return sum((counts.get(c, 0) - expected) ** 2 / expected for c in range(n))


# --- fields -------------------------------------------------------------------------------


@given(key=KEYS, n=CHANNELS)
def test_fields_replay_goes_to_the_live_channel(key: object, n: int) -> None:
    h = key_hash(key)
    live = FieldsPartitioner(n).select(key_hash=h)
    replay = _replayed("fields", n).select_replay(PersistedRoute(key_hash=h, channel=None))
    assert live == replay
    (c,) = live
    assert 0 <= c < n
    assert (h - c) % n == 0  # c is pmod(h, n): same residue class, non-negative


def test_fields_pmod_of_negative_hash_is_non_negative() -> None:
    # -7 pmod 3 is 2 in Spark (and Python); C-style remainder would give -1 or abs() 1.
    assert FieldsPartitioner(3).select(key_hash=-7) == [2]
    assert FieldsPartitioner(4).select_replay(PersistedRoute(-(2**63), None)) == [0]
    assert FieldsPartitioner(5).select_replay(PersistedRoute(-(2**63), None)) == [2]


def test_fields_live_needs_a_key_hash() -> None:
    with pytest.raises(PartitioningError, match="fields partitioner"):
        FieldsPartitioner(4).select()


# --- global --------------------------------------------------------------------------------


@given(n=CHANNELS, h=I64, c=st.none() | st.integers(0, 65534))
def test_global_replay_matches_live(n: int, h: int, c: int | None) -> None:
    rec = PersistedRoute(h, c)
    assert GlobalPartitioner(n).select() == _replayed("global", n).select_replay(rec) == [0]


# --- rebalance ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("offset", [None, 0, 5])
def test_rebalance_is_exactly_balanced(n: int, offset: int | None) -> None:
    k = 9
    p = RebalancePartitioner(n, offset=offset)
    live = Counter(c for _ in range(k * n) for c in p.select())
    replay = Counter(c for _ in range(k * n) for c in p.select_replay(PersistedRoute(0, None)))
    assert live == replay == Counter(dict.fromkeys(range(n), k))


def test_rebalance_is_round_robin_from_the_offset() -> None:
    p = RebalancePartitioner(4, offset=6)
    assert [p.select()[0] for _ in range(6)] == [2, 3, 0, 1, 2, 3]
    assert [p.select_replay(PersistedRoute(0, 0))[0] for _ in range(3)] == [2, 3, 0]
    q = pickle.loads(pickle.dumps(p))  # a fixed offset pickles with its position
    assert q.select() == p.select() == [0]


def test_rebalance_random_start_redrawn_per_copy() -> None:
    p = RebalancePartitioner(1000)
    blob = pickle.dumps(p)
    firsts = {pickle.loads(blob).select()[0] for _ in range(20)}
    assert len(firsts) > 1  # all 20 equal has probability 1e-57


# --- shuffle ------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "form"), [(8, "live"), (8, "replay"), (16, "live")])
def test_shuffle_passes_chi_square(n: int, form: str) -> None:
    total = 2000 * n
    p = ShufflePartitioner(n, seed=20240501)
    rec = PersistedRoute(123, 1)
    draw: Callable[[], list[int]] = (
        p.select if form == "live" else (lambda: p.select_replay(rec))
    )
    counts = Counter(c for _ in range(total) for c in draw())
    assert set(counts) <= set(range(n))
    assert _chi_square(counts, n, total) < CHI2_CRIT_P001[n - 1]


def test_chi_square_rejects_a_broken_shuffle() -> None:
    total = 2000 * 8
    assert _chi_square(Counter({0: total}), 8, total) > CHI2_CRIT_P001[7]
    skewed = Counter({c: total // 8 for c in range(8)})
    skewed[0] += 300
    skewed[1] -= 300
    assert _chi_square(skewed, 8, total) > CHI2_CRIT_P001[7]


def test_shuffle_seed_is_reproducible_in_process() -> None:
    a, b = ShufflePartitioner(50, seed=7), ShufflePartitioner(50, seed=7)
    assert [a.select() for _ in range(30)] == [b.select() for _ in range(30)]


def test_shuffle_unpickled_copies_do_not_share_a_stream() -> None:
    blob = pickle.dumps(ShufflePartitioner(1 << 16))
    seqs = {tuple(pickle.loads(blob).select()[0] for _ in range(8)) for _ in range(5)}
    assert len(seqs) == 5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("seed", [None, 42])
def test_shuffle_reseeds_after_fork(seed: int | None) -> None:
    p = ShufflePartitioner(1 << 16, seed=seed)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.write(write_fd, json.dumps([p.select()[0] for _ in range(16)]).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        child_seq = json.loads(f.read())
    os.waitpid(pid, 0)
    parent_seq = [p.select()[0] for _ in range(16)]
    assert len(child_seq) == 16
    assert child_seq != parent_seq


# --- interface, factory, validation -------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_factory_builds_every_strategy(strategy: str) -> None:
    p = partitioner_for(strategy, 5)
    assert isinstance(p, Partitioner) and isinstance(p, ReplayPartitioner)
    assert p.strategy == strategy and p.num_channels == 5
    r = replay_partitioner_for(strategy, 5)
    assert type(r) is type(p) and r.num_channels == 5
    q = pickle.loads(pickle.dumps(p))
    assert type(q) is type(p) and q.num_channels == 5
    assert repr(p) == f"{type(p).__name__}(num_channels=5)"
    for h, channel in [(1, 0), (-2, 1), (3, 4)]:
        chans = q.select_replay(PersistedRoute(h, channel))
        assert chans and all(0 <= c < 5 for c in chans)


def test_factory_knows_the_source_strategies() -> None:
    assert set(STRATEGIES) == {"fields", "rebalance", "shuffle", "global"}


@pytest.mark.parametrize("name", ["hash", "Fields", "", "keyBy"])
def test_factory_unknown_strategy_lists_known(name: str) -> None:
    with pytest.raises(PartitioningError) as info:
        replay_partitioner_for(name, 3)
    assert repr(name) in str(info.value)
    assert all(repr(s) in str(info.value) for s in STRATEGIES)
    assert isinstance(info.value, FTLayerError)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3", None])
@pytest.mark.parametrize("strategy", ["fields", "shuffle"])
def test_bad_num_channels(strategy: str, bad: object) -> None:
    with pytest.raises(PartitioningError, match=f"{strategy} partitioner: num_channels"):
        partitioner_for(strategy, bad)  # type: ignore[arg-type]


@given(st.lists(I64, max_size=50), CHANNELS, st.integers(0, 300))
def test_select_channels_is_select_per_record(hashes: list[int], n: int, offset: int) -> None:
    # ingest routes a batch with select_channels: the same channels, and the same state after
    for strategy, make in (("fields", lambda: FieldsPartitioner(n)), ("global", lambda: GlobalPartitioner(n)),
                           ("rebalance", lambda: RebalancePartitioner(n, offset))):
        batch, single, arrays = make(), make(), make()
        first = batch.select_channels(hashes)
        assert first == [single.select(key_hash=h)[0] for h in hashes], strategy
        second = batch.select_channels(hashes)
        assert second == [single.select(key_hash=h)[0] for h in hashes], strategy
        # the array form (ingest's fast path): the same channels as int64, the same state after
        for want in (first, second):
            got = arrays.select_channel_array(np.asarray(hashes, dtype=np.int64))
            assert got.dtype == np.int64 and got.tolist() == want, strategy


def test_select_channels_of_a_shuffle_stays_in_range() -> None:
    got = ShufflePartitioner(7, seed=1).select_channels([0] * 700)
    assert set(got) == set(range(7))


def test_fields_select_channels_needs_every_key_hash() -> None:
    with pytest.raises(PartitioningError, match="key hash"):
        FieldsPartitioner(4).select_channels([1, None])  # type: ignore[list-item]

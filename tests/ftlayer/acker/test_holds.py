"""Holds on a real server: the timeouts of records a running batch read follow the batch.

The clock is injected (FakeClock): rotations are driven by hand and hold deadlines are set
in that clock's milliseconds, so nothing here sleeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from ftlayer.acker.holds import STALE_AFTER_S, Holds, hold_lease_s
from ftlayer.acker.rotating_map import EXPIRE
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.cluster import EmbeddedCluster
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, commit_all


def _persist(layer: FTLayer, n: int) -> list[int]:
    recs = [make_record(layer, i, key=f"k{i}") for i in range(n)]
    layer.persist(recs)
    return [r.record_id.source_record_id for r in recs]


def _read(layer: FTLayer, channel: int, hold: str | None = None) -> list[int]:
    """A read task's read of a whole channel (every shard), filing what it read under ``hold``."""
    return [sid for shard in layer.shards for batch in shard.persistence.iter_channel(channel, hold=hold)
            for sid in batch.pending()[0]]


def _ms(clock: FakeClock, ahead_s: float = 0.0) -> int:
    return int((clock() + ahead_s) * 1000)


@pytest.fixture(params=["single", "cluster"])
def held_layer(request: pytest.FixtureRequest, redis_server_url: str, clock: FakeClock) -> Iterator[FTLayer]:
    url = redis_server_url
    if request.param == "cluster":  # EXPIRE declares the hold sets: a cluster node refuses any other key
        cluster: EmbeddedCluster = request.getfixturevalue("valkey_cluster")
        url = cluster.urls[0]
    cfg = FTConfig(redis_url=url, namespace=f"t{uuid.uuid4().hex[:10]}", timeout_s=10.0, num_buckets=3,
                   replay_backoff_initial_s=0.0)
    layer = FTLayer(cfg, "topo", "held", num_channels=2, clock=clock).open()
    yield layer
    for key in layer.store.client.scan_iter(match=f"{cfg.namespace}:*"):
        layer.store.client.delete(key)


def test_a_running_batch_keeps_its_records_from_timing_out_and_others_time_out_on_time(
    held_layer: FTLayer, clock: FakeClock,
) -> None:
    layer = held_layer
    _persist(layer, 400)
    held = _read(layer, 0, hold="b1")  # channel 0 is read by the running batch b1
    loose = _read(layer, 1)  # channel 1 by a batch that holds nothing
    assert held and loose and len(held) + len(loose) == 400
    layer.start_hold("b1", _ms(clock, 1000), _ms(clock))
    # not in a running batch: fails exactly on the num_buckets-th rotation after its persist
    for _ in range(layer.config.num_buckets - 1):
        layer.on_timeout()
    assert layer.stats()["failed_timeout"] == 0
    expired = set(layer.on_timeout().expired)
    assert expired == set(loose)
    stats = layer.stats()
    assert stats["failed_timeout"] == len(loose) and stats["refiled_held"] == len(held)
    for _ in range(2 * layer.config.num_buckets):  # a long batch: still held, refiled each time
        assert layer.on_timeout().expired == []
    assert layer.pending_count() == len(held)
    layer.end_hold("b1")  # the batch ended without acking them (its acks were lost)
    assert not layer.store.client.exists(layer.store.keys.held("b1"))
    failed: set[int] = set()
    for _ in range(layer.config.num_buckets):
        failed |= set(layer.on_timeout().expired)
    assert failed == set(held)  # they time out again at their next expiry, each once


def test_a_batch_that_settles_its_records_leaves_nothing(held_layer: FTLayer, clock: FakeClock) -> None:
    layer = held_layer
    sids = _persist(layer, 300)
    layer.start_hold("b2", _ms(clock, 1000), _ms(clock))
    read = _read(layer, 0, hold="b2") + _read(layer, 1, hold="b2")
    assert sorted(read) == sorted(sids)
    for _ in range(layer.config.num_buckets):
        layer.on_timeout()
    layer.record_batch_reads("b2", read, ("q", 0))
    assert layer.settle_batch("b2", "ack") == 300
    layer.end_hold("b2")
    commit_all(layer)
    assert layer.stats()["failed_timeout"] == 0
    assert layer.leftovers() == []


def test_a_lapsed_hold_holds_nothing(held_layer: FTLayer, clock: FakeClock) -> None:
    layer = held_layer
    _persist(layer, 100)
    read = _read(layer, 0, hold="old") + _read(layer, 1, hold="old")
    layer.start_hold("old", _ms(clock, 5), _ms(clock))  # its reader died: not renewed
    clock.advance(6)
    failed: list[int] = []
    for _ in range(layer.config.num_buckets):
        failed += layer.on_timeout().expired
    assert sorted(failed) == sorted(read)
    assert layer.stats()["refiled_held"] == 0


def test_a_hold_the_caller_did_not_declare_makes_expire_ask_again(held_layer: FTLayer, clock: FakeClock) -> None:
    """A batch that starts between the caller's look at ``holds`` and its EXPIRE call: EXPIRE sees a
    live hold it cannot check (its set is not declared), does nothing and says so."""
    layer = held_layer
    _persist(layer, 50)
    _read(layer, 0, hold="late")
    _read(layer, 1, hold="late")
    for _ in range(layer.config.num_buckets):
        layer.buckets.rotate(use_lease=False, expire=False)
    layer.start_hold("late", _ms(clock, 100), _ms(clock))
    store = layer.store
    blob, queued = store.run(
        EXPIRE,
        [*store.state_keys, store.keys.expq, store.keys.read_marks, store.keys.holds,
         *store.channel_keys(2)],
        [store.keys.prefix, store.now_ms(), *store.backoff_args(), 1000, 1 << 20, 50, 0],
    )
    assert (blob, int(queued)) == (b"", -1)
    assert layer.stats()["failed_timeout"] == 0
    assert layer.buckets.expire_pending() == []  # the real caller declares it and honours it
    assert layer.stats()["refiled_held"] == 50


def test_renew_moves_a_live_hold_and_never_revives_an_ended_one(held_layer: FTLayer, clock: FakeClock) -> None:
    layer = held_layer
    layer.start_hold("r", _ms(clock, 5), _ms(clock))
    assert layer.renew_hold("r", _ms(clock, 50), _ms(clock))
    (hold,) = layer.holds()
    assert (hold.tag, hold.deadline_ms) == ("r", _ms(clock, 50))
    layer.end_hold("r")
    assert not layer.renew_hold("r", _ms(clock, 500), _ms(clock))
    assert layer.holds() == []


def test_holds_lapsed_long_ago_are_cleaned(held_layer: FTLayer, clock: FakeClock) -> None:
    layer = held_layer
    _persist(layer, 10)
    _read(layer, 0, hold="gone")
    layer.start_hold("gone", _ms(clock, 1), _ms(clock))
    layer.start_hold("live", _ms(clock, 1000), _ms(clock))
    holds = Holds(layer.store)
    assert holds.clean(_ms(clock)) == 0  # lapsed only just: kept for now
    clock.advance(STALE_AFTER_S + 2)
    assert holds.clean(_ms(clock)) == 1
    assert [h.tag for h in layer.holds()] == ["live"]
    assert not layer.store.client.exists(layer.store.keys.held("gone"))


@pytest.mark.parametrize(("interval", "lease"), [(0.5, 2.0), (5.0, 5.0), (15.0, 10.0)])
def test_the_hold_lease_follows_the_rotation_interval_within_bounds(interval: float, lease: float) -> None:
    assert hold_lease_s(interval) == lease


def test_holds_of_a_sharded_source_are_kept_in_every_shard(make_layer: Callable[..., FTLayer],
                                                            clock: FakeClock) -> None:
    layer = make_layer(num_shards=4, source="shardedholds", num_channels=2)
    sids = _persist(layer, 400)
    layer.start_hold("s1", _ms(clock, 1000), _ms(clock))
    read = _read(layer, 0, hold="s1") + _read(layer, 1, hold="s1")
    assert sorted(read) == sorted(sids)
    for _ in range(layer.config.num_buckets + 1):
        assert layer.on_timeout().expired == []
    assert layer.stats()["refiled_held"] >= 400
    assert layer.end_holds() == 4  # one per shard
    failed: list[int] = []
    for _ in range(layer.config.num_buckets):
        failed += layer.on_timeout().expired
    assert sorted(failed) == sorted(sids)


def test_reset_timeout_restarts_the_timeout_of_a_records_chunk(held_layer: FTLayer, clock: FakeClock) -> None:
    """Storm's resetTimeout: the touched record's chunk fails num_buckets rotations after the touch,
    not after its persist; the others on time. Idempotent; records no longer pending are skipped."""
    layer = held_layer
    slow, *others = [_persist(layer, 1)[0] for _ in range(5)]  # one chunk each
    _read(layer, 0)
    _read(layer, 1)
    for _ in range(layer.config.num_buckets - 1):
        layer.on_timeout()
    assert layer.reset_timeout([slow]) == 1
    assert layer.reset_timeout([slow]) == 0  # already in the current bucket
    assert layer.reset_timeout([others[0] ^ (1 << 40)]) == 0  # no such chunk: nothing to do
    assert set(layer.on_timeout().expired) == set(others)  # the others fail on time
    for _ in range(layer.config.num_buckets - 2):
        assert layer.on_timeout().expired == []
    assert layer.on_timeout().expired == [slow]  # its own num_buckets-th rotation after the touch
    assert layer.reset_timeout([slow]) == 0  # failed: no longer pending


def test_end_carries_ends_every_carry_but_the_one_kept(held_layer: FTLayer, clock: FakeClock) -> None:
    """A committed batch makes the carry holds of earlier batches needless (runtime.spark.batch_holds)."""
    layer = held_layer
    for tag in ("b7", "carry-b5", "carry-b6"):
        layer.start_hold(tag, _ms(clock, 60), _ms(clock))
    assert layer.end_carries(keep="carry-b6") == 1
    assert sorted(h.tag for h in layer.holds()) == ["b7", "carry-b6"]
    assert layer.end_carries() == 1
    assert [h.tag for h in layer.holds()] == ["b7"]

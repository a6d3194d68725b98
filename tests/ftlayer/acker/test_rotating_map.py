"""Rotating timeout buckets on a real server (ports the original RotatingHashMapTest)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ftlayer.errors import LeaseLostError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, commit_all, hand_out


@pytest.mark.parametrize("k", [2, 3, 5])
def test_k_buckets_expire_a_key_exactly_on_the_kth_rotation(make_layer: Callable[..., FTLayer], k: int) -> None:
    layer = make_layer(num_buckets=k)
    expired: list[int] = []
    layer.buckets.on_expired = expired.extend
    rec = make_record(layer, "x")
    layer.persist([rec])
    hand_out(layer)  # only a record some task received times out (an unread one is re-filed)
    for _ in range(k - 1):
        assert layer.on_timeout().expired == []
    assert layer.on_timeout().expired == [rec.record_id.source_record_id]
    assert expired == [rec.record_id.source_record_id]
    assert layer.stats()["failed_timeout"] == 1


def test_removed_key_never_expires(layer: FTLayer) -> None:
    acked, failed = make_record(layer, "acked"), make_record(layer, "failed")
    kept = make_record(layer, "kept")
    layer.persist([acked, failed, kept])
    hand_out(layer)
    layer.ack({acked.record_id.source_record_id: acked.record_id.current_record_id})
    layer.fail([failed.record_id.source_record_id], "boom")
    expired = [layer.on_timeout().expired for _ in range(10)]
    assert [sid for step in expired for sid in step] == [kept.record_id.source_record_id]


def test_buckets_are_deleted_with_their_last_record(layer: FTLayer) -> None:
    recs = [make_record(layer, i) for i in range(20)]
    layer.persist(recs)
    layer.on_timeout()
    more = [make_record(layer, i) for i in range(5)]
    layer.persist(more)
    layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs + more})
    commit_all(layer)
    assert layer.leftovers() == []


def test_expiry_bound_in_time(make_layer: Callable[..., FTLayer], clock: FakeClock) -> None:
    """With the service rotating every T/(n-1), a record fails in [T, T*(1+1/(n-1))]."""
    timeout, n = 10.0, 3
    layer = make_layer(timeout_s=timeout, num_buckets=n, max_replays=0)  # no re-filed replays
    service = FTService([layer], clock=clock)
    failed_at: dict[int, float] = {}
    layer.buckets.on_expired = lambda ids: failed_at.update(dict.fromkeys(ids, clock.now))
    persisted_at: dict[int, float] = {}
    start = clock.now
    service.tick()  # takes the lease and schedules the first rotation
    step = 0.25
    while clock.now < start + 40:
        if clock.now < start + 15:
            rec = make_record(layer, clock.now)
            layer.persist([rec])
            hand_out(layer)  # read at once, as a running query does
            persisted_at[rec.record_id.source_record_id] = clock.now
        clock.advance(step)
        service.tick()
    assert set(failed_at) == set(persisted_at)
    bound = timeout * (1 + 1 / (n - 1))
    for sid, t0 in persisted_at.items():
        age = failed_at[sid] - t0
        assert timeout - step <= age <= bound + step, (age, timeout, bound)


def test_two_rotators_do_not_double_fail(make_layer: Callable[..., FTLayer], clock: FakeClock) -> None:
    a = make_layer(owner="driver-a", max_replays=0)
    b = make_layer(owner="driver-b", max_replays=0)
    recs = [make_record(a, i) for i in range(100)]
    a.persist(recs)
    hand_out(a)
    sa, sb = FTService([a], clock=clock), FTService([b], clock=clock)
    expired: list[int] = []
    a.buckets.on_expired = expired.extend
    b.buckets.on_expired = expired.extend
    for _ in range(40):
        clock.advance(a.config.rotation_interval_s / 2)
        sa.tick()
        sb.tick()
    assert sorted(expired) == sorted(r.record_id.source_record_id for r in recs)
    assert a.dead_letters.count() == 100  # each failed once and was set aside once
    # only one of the two rotated: 20 intervals passed, so about 20 rotations, not 40
    assert sa.rotations + sb.rotations <= 21
    assert min(sa.rotations, sb.rotations) == 0
    with pytest.raises(LeaseLostError):
        b.buckets.rotate(use_lease=True)


def test_lease_moves_to_the_other_driver_when_released(make_layer: Callable[..., FTLayer]) -> None:
    a, b = make_layer(owner="a"), make_layer(owner="b")
    assert a.buckets.acquire_lease(30) and not b.buckets.acquire_lease(30)
    assert a.buckets.release_lease()
    assert b.buckets.acquire_lease(30)


def test_rotate_with_expected_gen_is_idempotent(layer: FTLayer) -> None:
    gen = layer.buckets.current_gen()
    assert layer.buckets.rotate(use_lease=False, expected_gen=gen).rotated
    retry = layer.buckets.rotate(use_lease=False, expected_gen=gen)
    assert not retry.rotated and retry.gen == gen + 1

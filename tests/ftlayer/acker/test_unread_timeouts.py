"""Stalls do not spend the replay budget: a record no task has read is re-filed, not failed (real server)."""

from __future__ import annotations

from collections.abc import Callable

from ftlayer.facade.ft_layer import FTLayer
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, commit_all, hand_out


def _replay_counts(layer: FTLayer) -> list[int]:
    channels = range(layer.num_channels)
    return sorted(r.replay_count for ch in channels for r in layer.persistence.read_channel(ch).records())


def test_unread_records_outlast_any_number_of_timeouts_without_spending_replays(
    make_layer: Callable[..., FTLayer], clock: FakeClock
) -> None:
    layer = make_layer(max_replays=2, num_buckets=3)
    recs = [make_record(layer, {"i": i}, key=f"k{i}") for i in range(50)]
    layer.persist(recs)
    # a stall of 5 x (max_replays + 1) timeouts: nobody reads the channels
    for _ in range(5 * 3 * layer.config.num_buckets):
        layer.on_timeout()
        clock.advance(60)
        layer.replay_due()
    stats = layer.stats()
    assert stats["failed_timeout"] == 0 and stats["replayed"] == 0 and stats["dead_lettered"] == 0
    assert stats["refiled_unread"] >= 50 and stats["pending"] == 50
    # the same ids are still pending (no new ids, no duplicates), each still filed in exactly one bucket
    values = {layer.acker.value(r.record_id.source_record_id) for r in recs}
    assert values == {r.record_id.current_record_id for r in recs}
    bcnt = {int(k): int(v) for k, v in layer.store.client.hgetall(layer.store.keys.bcnt).items()}
    assert sum(bcnt.values()) == 50
    # the stall ends: a task reads them (replay count still 0) and acks them; nothing is left
    assert hand_out(layer) == 50
    assert _replay_counts(layer) == [0] * 50
    done = layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs})
    assert len(done.acked) == 50
    commit_all(layer)
    assert layer.leftovers() == []


def test_a_record_handed_to_a_task_times_out_and_counts_as_before(
    make_layer: Callable[..., FTLayer], clock: FakeClock
) -> None:
    layer = make_layer(max_replays=1, num_buckets=3)
    rec = make_record(layer, "x")
    layer.persist([rec])
    assert hand_out(layer) == 1
    assert hand_out(layer) == 1  # a re-run batch reads it again: still pending, still marked once
    for _ in range(layer.config.num_buckets):
        layer.on_timeout()
    assert layer.stats()["failed_timeout"] == 1
    assert layer.replay_due().replayed == 1
    assert _replay_counts(layer) == [1]
    # the replay is read too, times out again: max_replays = 1 is spent, it is dead-lettered
    for _ in range(layer.config.num_buckets):
        layer.on_timeout()
    clock.advance(60)
    assert layer.replay_due().dead_lettered == 1


def test_only_the_unread_part_of_a_generation_is_refiled(make_layer: Callable[..., FTLayer]) -> None:
    """Records of one bucket generation, partly read: the read ones fail, the rest are re-filed."""
    layer = make_layer(num_buckets=3, num_channels=1)
    read = [make_record(layer, i) for i in range(5)]
    unread = [make_record(layer, i) for i in range(5, 12)]
    layer.persist(read)
    assert hand_out(layer) == 5  # the reader stops here (same generation as what follows)
    layer.persist(unread)
    failed: list[int] = []
    for _ in range(layer.config.num_buckets):
        failed += layer.on_timeout().expired
    assert sorted(failed) == sorted(r.record_id.source_record_id for r in read)
    assert layer.stats()["refiled_unread"] == 7


def test_a_refiled_record_keeps_its_partial_xor_and_times_out_once_read(
    make_layer: Callable[..., FTLayer], clock: FakeClock
) -> None:
    """Re-filing keeps the ack value. Once a task has read the re-filed record it gets one more
    timeout (it may have been read just before the check), then it fails: a record read and then
    lost is replayed, never re-filed for ever."""
    layer = make_layer(num_buckets=2, max_replays=3)
    rec = make_record(layer, "x")
    sid, cid = rec.record_id
    layer.persist([rec])
    layer.xor({sid: 0x55})  # a delta of some earlier, partial flush
    for _ in range(2 * layer.config.num_buckets):
        assert layer.on_timeout().expired == []
    assert layer.acker.value(sid) == cid ^ 0x55
    assert hand_out(layer) == 1  # read after it was re-filed twice; the task then dies
    for _ in range(layer.config.num_buckets):  # the grace timeout
        assert layer.on_timeout().expired == []
    expired: list[int] = []
    for _ in range(layer.config.num_buckets):
        expired += layer.on_timeout().expired
    assert expired == [sid]
    assert layer.stats()["refiled_unread"] == 2
    clock.advance(60)
    assert layer.replay_due().replayed == 1
    assert _replay_counts(layer) == [1]
    bcnt = {int(k): int(v) for k, v in layer.store.client.hgetall(layer.store.keys.bcnt).items()}
    assert sum(bcnt.values()) == 1 == layer.pending_count()


def test_bounded_scans_resume_inside_refiled_elements(make_layer: Callable[..., FTLayer]) -> None:
    """Tiny EXPIRE chunks over elements of re-filed records: the pushed-back rest keeps its
    encoding, so each record is re-filed once per timeout and, once read, fails exactly once."""
    layer = make_layer(num_buckets=2, num_channels=2)
    layer.buckets.scan_max_records = 7
    recs = [make_record(layer, i, key=f"k{i}") for i in range(30)]
    layer.persist(recs)
    sids = {r.record_id.source_record_id for r in recs}
    for _ in range(3 * layer.config.num_buckets):
        assert layer.on_timeout().expired == []
    assert layer.stats()["refiled_unread"] == 3 * 30 and layer.pending_count() == 30  # 3 expiries
    bcnt = {int(k): int(v) for k, v in layer.store.client.hgetall(layer.store.keys.bcnt).items()}
    assert sum(bcnt.values()) == 30
    assert hand_out(layer) == 30
    expired: list[int] = []
    for _ in range(3 * layer.config.num_buckets):
        expired += layer.on_timeout().expired
    assert sorted(expired) == sorted(sids) and layer.stats()["failed_timeout"] == 30
    assert layer.stats()["refiled_unread"] == 3 * 30  # the grace timeout of a read record is not counted


def test_a_bounded_read_marks_the_entry_it_stopped_in(make_layer: Callable[..., FTLayer]) -> None:
    """The watermark moves to the cursor entry of a bounded read (finished or entered), not past it."""
    layer = make_layer(num_buckets=2, num_channels=1)
    first = [make_record(layer, i) for i in range(5)]
    second = [make_record(layer, i) for i in range(5, 10)]
    layer.persist(first)  # entry 1
    layer.persist(second)  # entry 2, same generation
    batch = layer.persistence.read_channel(0, max_records=3)  # stops inside entry 1
    assert len(batch.frames) == 3 and batch.skip == 3
    marks = layer.store.keys.read_marks
    entered = batch.last_id
    assert layer.store.client.hget(marks, "0").decode().endswith(" " + entered)
    failed: list[int] = []
    for _ in range(layer.config.num_buckets):
        failed += layer.on_timeout().expired
    assert sorted(failed) == sorted(r.record_id.source_record_id for r in first)
    assert layer.stats()["refiled_unread"] == 5
    # a re-run batch reading from the start does not move the watermark back
    layer.persistence.read_channel(0, max_records=1)
    assert layer.store.client.hget(marks, "0").decode().endswith(" " + entered)
    # reading on enters entry 2 (one id of it examined): the watermark moves to it
    batch = layer.persistence.read_channel(0, entered, max_records=1)
    assert len(batch.frames) == 1 and batch.last_id != entered and batch.skip == 1
    assert layer.store.client.hget(marks, "0").decode().endswith(" " + batch.last_id)

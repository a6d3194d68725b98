"""Fail and replay: new id, same bytes and key hash, backoff, dead letters (real server)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedRecord
from ftlayer.records.keyhash import key_hash, pmod
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, commit_all


def _frames_in_channel(layer: FTLayer, ch: int) -> list[SemiDeserializedRecord]:
    return layer.persistence.read_channel(ch).records()


def test_explicit_fail_replays_same_bytes_and_key_hash_under_new_id(layer: FTLayer) -> None:
    rec = make_record(layer, {"user": "ann", "n": 7}, key="ann")
    layer.persist([rec])
    sid = rec.record_id.source_record_id
    assert layer.fail([sid], "FailRecord: bad") == 1
    assert layer.acker.value(sid) is None  # the old id's acker entry is gone
    assert layer.replay_due().replayed == 1
    ch = pmod(key_hash("ann"), layer.num_channels)
    replays = [r for r in _frames_in_channel(layer, ch) if r.origin_id == sid]
    assert len(replays) == 1
    new = replays[0]
    assert new.payload == rec.payload and new.key_hash == rec.key_hash == key_hash("ann")
    assert new.record_id.source_record_id != sid and new.replay_count == 1 and new.channel == ch
    # the root current id is kept: each output of the replay's tree has its first attempt's lineage id
    assert new.record_id.current_record_id == rec.record_id.current_record_id
    assert layer.acker.value(new.record_id.source_record_id) == new.record_id.current_record_id
    # a late ack for the old id does nothing; the replay is still pending
    late = layer.ack({sid: rec.record_id.current_record_id})
    assert late.late == 1 and layer.pending_count() == 1


def test_fail_inside_flush_wins_over_deltas_of_the_same_flush(layer: FTLayer) -> None:
    rec = make_record(layer, "x")
    layer.persist([rec])
    sid, cur = rec.record_id
    result = layer.xor({sid: cur}, fails={sid: "explicit"})
    assert result.failed == 1 and result.acked == [] and result.late == 1


def test_backoff_delays_replay(make_layer: Callable[..., FTLayer], clock: FakeClock) -> None:
    layer = make_layer(replay_backoff_initial_s=2.0, replay_backoff_multiplier=3.0, replay_backoff_max_s=60)
    rec = make_record(layer, "x")
    layer.persist([rec])
    layer.fail([rec.record_id.source_record_id])
    clock.advance(1.9)
    assert layer.replay_due().replayed == 0
    clock.advance(0.2)
    assert layer.replay_due().replayed == 1
    replay = next(r for ch in range(4) for r in _frames_in_channel(layer, ch) if r.replay_count == 1)
    layer.fail([replay.record_id.source_record_id])
    clock.advance(5.9)  # second replay waits 2 * 3 = 6 s
    assert layer.replay_due().replayed == 0
    clock.advance(0.2)
    assert layer.replay_due().replayed == 1


def test_backoff_is_capped(make_layer: Callable[..., FTLayer], clock: FakeClock) -> None:
    """The fail's backoff (in the server-side Lua: initial * multiplier ** replays) stops at replay_backoff_max_s."""
    layer = make_layer(replay_backoff_initial_s=0.5, replay_backoff_multiplier=2.0, replay_backoff_max_s=3.0)
    rec = make_record(layer, "x")
    layer.persist([rec])
    sid = rec.record_id.source_record_id
    for replays, delay in enumerate([0.5, 1.0, 2.0, 3.0, 3.0]):
        layer.fail([sid])
        clock.advance(delay - 0.1)
        assert layer.replay_due().replayed == 0, replays
        clock.advance(0.2)
        assert layer.replay_due().replayed == 1, replays
        sid = next(r for ch in range(4) for r in _frames_in_channel(layer, ch)
                   if r.replay_count == replays + 1).record_id.source_record_id


def test_poison_record_is_dead_lettered_after_max_replays(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=3)
    rec = make_record(layer, {"poison": True}, key="p")
    layer.persist([rec])
    current = rec
    for attempt in range(4):
        layer.fail([current.record_id.source_record_id], f"ValueError: attempt {attempt}")
        result = layer.replay_due()
        if attempt < 3:
            assert result.replayed == 1
            found = [r for ch in range(4) for r in _frames_in_channel(layer, ch) if r.replay_count == attempt + 1]
            current = found[0]
        else:
            assert result == result.__class__(0, 1)
    letters = layer.dead_letters.list()
    assert len(letters) == 1
    dl = letters[0]
    assert dl.origin_id == rec.record_id.source_record_id and dl.replay_count == 3
    assert dl.reason == "ValueError: attempt 3" and dl.dead_ms >= dl.failed_ms > 0
    assert dl.record is not None and dl.record.payload == rec.payload
    assert layer.pending_count() == 0
    stats = layer.stats()
    assert (stats["replayed"], stats["dead_lettered"], stats["failed_explicit"]) == (3, 1, 4)
    commit_all(layer)
    assert layer.leftovers() == []


def test_two_replayers_replay_each_failure_once(make_layer: Callable[..., FTLayer]) -> None:
    a, b = make_layer(), make_layer()
    recs = [make_record(a, i, key=f"k{i}") for i in range(200)]
    a.persist(recs)
    a.fail([r.record_id.source_record_id for r in recs])
    due_a, due_b = a.replayer.due(1000), b.replayer.due(1000)
    assert len(due_a) == len(due_b) == 200
    ra, rb = a.replayer.replay_due(), b.replayer.replay_due()
    assert ra.replayed + rb.replayed == 200
    assert a.pending_count() == 200


def test_replay_routing_uses_the_router(make_layer: Callable[..., FTLayer]) -> None:
    class ToLast:
        def select_replay(self, record: SemiDeserializedRecord) -> list[int]:
            return [3]

    layer = make_layer(replay_router=ToLast())
    rec = make_record(layer, "x", channel=0)
    layer.persist([rec])
    layer.fail([rec.record_id.source_record_id])
    layer.replay_due()
    assert [r.origin_id for r in _frames_in_channel(layer, 3)] == [rec.record_id.source_record_id]


def test_failed_entry_layout(layer: FTLayer, clock: FakeClock) -> None:
    rec = make_record(layer, "x")
    layer.persist([rec])
    layer.fail([rec.record_id.source_record_id], "why")
    raw = layer.store.client.hget(layer.store.keys.failed, struct.pack(">q", rec.record_id.source_record_id))
    ms, rlen = struct.unpack(">dH", raw[:10])
    assert ms == int(clock.now * 1000) and raw[10 : 10 + rlen] == b"why"

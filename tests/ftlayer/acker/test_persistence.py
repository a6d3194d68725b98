"""Persistence on a real server: atomic batches, idempotent retries, channel reads, durability."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from ftlayer.errors import ChannelCountMismatchError, ChunkIdInUseError, FrameError, InvalidArgumentError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from serialization.payload import unpack_payload
from serialization.serializers import make_record


def test_persist_is_idempotent_under_retry(layer: FTLayer) -> None:
    recs = [make_record(layer, i, key=f"k{i}") for i in range(100)]
    assert layer.persist(recs) == 100
    assert layer.persist(recs) == 0
    assert layer.pending_count() == 100
    per_channel = sum(len(layer.persistence.read_channel(c).frames) for c in range(4))
    assert per_channel == 100
    assert layer.stats()["persisted"] == 100


def test_persist_stores_frame_ack_value_and_bucket(layer: FTLayer) -> None:
    rec = make_record(layer, {"a": [1, 2]}, key="u")
    layer.persist([rec])
    assert layer.acker.value(rec.record_id.source_record_id) == rec.record_id.current_record_id
    batch = layer.persistence.read_channel(rec.channel or 0)
    assert batch.records() == [rec]
    assert layer.store.client.hget(layer.store.keys.bcnt, "0") == b"1"


def test_reread_of_a_range_skips_completed_records(layer: FTLayer) -> None:
    recs = [make_record(layer, i, channel=1) for i in range(10)]
    layer.persist(recs[:5])
    first = layer.persistence.read_channel(1)
    layer.persist(recs[5:])
    done = recs[0]
    layer.ack({done.record_id.source_record_id: done.record_id.current_record_id})
    again = layer.persistence.read_channel(1, "-", first.last_id)
    assert [r.record_id for r in again.records()] == [r.record_id for r in recs[1:5]]
    rest = layer.persistence.read_channel(1, first.last_id)
    assert [r.record_id for r in rest.records()] == [r.record_id for r in recs[5:]]
    assert layer.persistence.trim(1, first.last_id) == 1
    assert layer.persistence.read_channel(1).records() == rest.records()


def test_bad_channel_is_refused_before_anything_is_written(layer: FTLayer) -> None:
    good = make_record(layer, "ok", channel=0)
    with pytest.raises(FrameError, match="channel 9"):
        layer.persist([good, make_record(layer, "bad", channel=9)])
    frame = SemiDeserializedSerializer().encode(make_record(layer, "bad", channel=0).__class__(
        0, good.record_id.__class__(5, 6), 1, 5, 0, b"\xc0", 7))
    from ftlayer.errors import AckerError

    with pytest.raises(AckerError, match="out of range"):
        layer.persistence.persist_frames([SemiDeserializedSerializer().encode(good), frame])
    assert layer.pending_count() == 0


def test_channel_count_is_recorded_and_checked(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(num_channels=4)
    layer.persist([make_record(layer, 1)])  # in flight: the count cannot change (see test_rescale.py)
    with pytest.raises(ChannelCountMismatchError, match="persisted with 4 channels but this run uses 3"):
        make_layer(num_channels=3)


def test_trim_done_drops_only_the_completed_head(layer: FTLayer) -> None:
    first = [make_record(layer, i, channel=0) for i in range(3)]
    second = [make_record(layer, i, channel=0) for i in range(3)]
    layer.persist(first)
    layer.persist(second)
    client, ch = layer.store.client, layer.store.keys.channel(0)
    assert client.xlen(ch) == 2
    layer.ack({second[0].record_id.source_record_id: second[0].record_id.current_record_id})
    assert layer.persistence.trim_done() == 0  # the head entry still has pending records
    layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in first})
    assert layer.persistence.trim_done() == 1 and client.xlen(ch) == 1
    layer.fail([r.record_id.source_record_id for r in second[1:]])
    assert layer.persistence.trim_done() == 1 and client.xlen(ch) == 0
    assert layer.persistence.trim_done() == 0


def test_a_retried_persist_files_nothing_even_after_its_records_were_acked(
    make_layer: Callable[..., FTLayer],
) -> None:
    """Records are visible as soon as PERSIST runs, before a durability wait or a lost reply lets
    the caller retry: the retry must not file records that were processed and acked meanwhile."""
    layer = make_layer()
    recs = [make_record(layer, i, channel=i % 4) for i in range(30)]
    frames = [SemiDeserializedSerializer().encode(r) for r in recs]
    assert layer.persist_frames(frames) == 30
    assert len(layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs}).acked) == 30
    assert layer.persist_frames(frames) == 0  # the retry
    assert layer.pending_count() == 0 and layer.stats()["persisted"] == 30
    assert sum(len(layer.persistence.read_channel(c).frames) for c in range(4)) == 0


def test_an_overlapping_batch_is_not_taken_for_a_retry(layer: FTLayer) -> None:
    recs = [make_record(layer, i, key=f"k{i}") for i in range(20)]
    assert layer.persist(recs[:10]) == 10
    assert layer.persist(recs) == 10  # the same first record, but another call: the new ten are filed
    assert layer.pending_count() == 20


def _clashing(layer: FTLayer, pending: SemiDeserializedRecord) -> SemiDeserializedRecord:
    """Another record under the id of a pending one (its current id differs): its call is refused."""
    other = make_record(layer, "other", channel=0)
    rid = RecordId(pending.record_id.source_record_id, pending.record_id.current_record_id ^ 1)
    return dataclasses.replace(other, record_id=rid)


@pytest.mark.parametrize("shards", [1, 4])
def test_a_persist_refused_in_part_says_exactly_what_was_filed_and_a_retry_files_nothing_twice(
    make_layer: Callable[..., FTLayer], shards: int,
) -> None:
    """Issue 27 item 7: the calls of a persist are atomic one by one, not together. The error must
    name what the applied calls filed, so a caller retries only the refused records."""
    layer = make_layer(flush_batch_size=2, num_shards=shards)  # 2 records a call: many calls
    first = make_record(layer, "first", channel=0)
    assert layer.persist([first]) == 1
    batch = [make_record(layer, f"v{i}", channel=i % 4) for i in range(12)]
    batch.insert(5, _clashing(layer, first))
    with pytest.raises(ChunkIdInUseError) as info:
        layer.persist(batch)
    err = info.value
    clash_sid = first.record_id.source_record_id
    assert clash_sid in err.refused
    assert sorted([*err.filed, *err.refused]) == sorted(r.record_id.source_record_id for r in batch)
    assert set(err.filed).isdisjoint(err.refused)
    assert err.filed and err.new == len(err.filed)  # the other calls were applied, and the error says so
    assert layer.pending_count() == 1 + err.new
    assert "retry only the refused ones" in str(err) and "nothing was written" not in str(err)
    # the caller's retry: the refused records other than the clash, under new ids
    again = [make_record(layer, unpack_payload(r.payload), channel=r.channel)
             for r in batch if r.record_id.source_record_id in set(err.refused) and r is not batch[5]]
    assert layer.persist(again) == len(again)
    assert layer.pending_count() == 1 + 12  # every record of the batch once: nothing filed twice
    payloads = sorted(str(unpack_payload(f.payload)) for c in range(4) for f in _frames(layer, c))
    assert payloads == sorted(["first", *(f"v{i}" for i in range(12))])


def _frames(layer: FTLayer, channel: int) -> list[Any]:
    ser = SemiDeserializedSerializer()
    shards = layer.shards if layer.num_shards > 1 else [layer]
    return [ser.decode(f) for s in shards for b in s.persistence.iter_channel(channel) for f in b.frames]


def test_a_record_that_is_not_one_points_at_make_record(layer: FTLayer) -> None:
    with pytest.raises(InvalidArgumentError, match=r"see serialization\.make_record"):
        layer.persist(["not a record"])  # type: ignore[list-item]

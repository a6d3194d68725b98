"""Fails without replays and unreadable stored frames, against a real server (no Spark)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ftlayer.errors import FrameError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunks import chunk_key, frame_spans
from ftlayer.records.frames import SemiDeserializedSerializer
from serialization.serializers import make_record, make_records
from tests.ftlayer.conftest import FakeClock


def test_a_fail_without_replay_is_dead_lettered_at_once_despite_backoff(
    make_layer: Callable[..., FTLayer], clock: FakeClock
) -> None:
    layer = make_layer(max_replays=5, replay_backoff_initial_s=10.0)
    final, normal = make_record(layer, "deterministic"), make_record(layer, "transient")
    layer.persist([final, normal])
    fsid, nsid = final.record_id.source_record_id, normal.record_id.source_record_id
    result = layer.xor({}, fails={fsid: "FailRecord (replay=False): bad", nsid: "flaky"}, no_replay={fsid})
    assert result.failed == 2
    step = layer.replay_due()  # no clock advance: only the no-replay failure is due
    assert (step.replayed, step.dead_lettered) == (0, 1)
    (letter,) = layer.dead_letters.list()
    assert letter.source_record_id == fsid and letter.reason == "FailRecord (replay=False): bad"
    assert letter.replay_count == 0
    clock.advance(10.1)
    assert layer.replay_due().replayed == 1  # the other one keeps its backoff and its replays


def test_fail_unreadable_fails_a_corrupt_stored_frame_once_by_its_place_in_its_chunk(
    make_layer: Callable[..., FTLayer], redis_client: Any
) -> None:
    layer = make_layer()
    recs = make_records(layer, [{"i": i} for i in range(2)], channel=0)  # one chunk of two
    layer.persist(recs)
    sid = recs[1].record_id.source_record_id  # the last frame of the chunk
    key = chunk_key(sid)
    raw = redis_client.hget(layer.store.keys.chunk_frames, key)
    _start, end = frame_spans(raw, 2)[1]  # the last frame ends before the chunk's CRC
    redis_client.hset(layer.store.keys.chunk_frames, key, raw[: end - 1] + bytes([raw[end - 1] ^ 1]) + raw[end:])
    sids = [s for b in layer.persistence.iter_channel(0) for s in b.sids]
    frames = [f for b in layer.persistence.iter_channel(0) for f in b.frames]
    assert sid in sids  # the reader names it by its place, whatever its bytes say
    with pytest.raises(FrameError, match="checksum"):
        SemiDeserializedSerializer().decode(frames[sids.index(sid)])
    assert layer.persistence.fail_unreadable([(sid, "checksum mismatch")]) == 1
    assert layer.persistence.fail_unreadable([(sid, "checksum mismatch")]) == 0  # idempotent
    assert layer.replay_due().dead_lettered == 1
    (letter,) = layer.dead_letters.list()
    assert letter.record is None and letter.reason == "checksum mismatch"
    assert layer.pending_count() == 1  # the other record of the chunk is untouched

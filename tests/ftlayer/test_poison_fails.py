"""Fails without replays and unreadable stored frames, against a real server (no Spark)."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from ftlayer.layer import FTLayer
from ftlayer.persistence import PEND_PREFIX
from serialization.serializers import make_record
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


def test_fail_unreadable_fails_a_corrupt_pend_value_once_and_only_if_unchanged(
    make_layer: Callable[..., FTLayer], redis_client: Any
) -> None:
    layer = make_layer()
    rec = make_record(layer, {"i": 1})
    layer.persist([rec])
    sid = struct.pack(">q", rec.record_id.source_record_id)
    raw = redis_client.hget(layer.store.keys.pend, sid)
    corrupt = raw[:-1] + bytes([raw[-1] ^ 1])
    # a value read before the entry changed fails nothing
    assert layer.persistence.fail_unreadable([(corrupt, "checksum mismatch")]) == 0
    assert layer.persistence.fail_unreadable([(corrupt[: PEND_PREFIX + 10], "truncated")]) == 0
    redis_client.hset(layer.store.keys.pend, sid, corrupt)
    assert layer.persistence.fail_unreadable([(corrupt, "checksum mismatch")]) == 1
    assert layer.persistence.fail_unreadable([(corrupt, "checksum mismatch")]) == 0  # idempotent
    assert layer.replay_due().dead_lettered == 1
    (letter,) = layer.dead_letters.list()
    assert letter.record is None and letter.reason == "checksum mismatch"
    assert layer.pending_count() == 0

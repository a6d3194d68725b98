"""Poison records anywhere in a task fail only themselves, on real Spark and a real server.

A key selector that raises, an output msgpack cannot carry, a keyed state that cannot be loaded
or saved, and a stored frame that fails its checksum each fail their own record: it is replayed
up to ``max_replays`` times and then dead-lettered with its reason (at once for
``FailRecord(..., replay=False)`` and for a frame whose stored bytes are corrupt), while every
other record reaches the sink and the streaming query stays up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.acker.dead_letter_entry import DeadLetter
from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunks import chunk_key, frame_spans, index_of
from runtime.sinks import JsonLinesSink
from runtime.spark.keyed_state import KeyedStateStore, state_key
from runtime.topology import FTQuery, Topology
from serialization.payload import pack_payload, unpack_payload
from serialization.serializers import make_records
from tests.runtime.test_topology_e2e import clicks

pytestmark = pytest.mark.spark

MAX_REPLAYS = 2


def drain_and_check_alive(query: FTQuery, timeout_s: float = 240) -> None:
    """Drain, then check that the streaming query is still up (a poison record must not kill it)."""
    try:
        assert query.await_drained(timeout_s), query.stats()
        assert query.query.isActive and query.query.exception() is None
        query.query.processAllAvailable()
    finally:
        query.stop()


def letters_by_i(letters: list[DeadLetter]) -> dict[int, DeadLetter]:
    out: dict[int, DeadLetter] = {}
    for letter in letters:
        assert letter.record is not None, letter
        out[unpack_payload(letter.record.payload)["i"]] = letter
    return out


def test_key_selector_unpackable_output_and_fail_record_without_replay(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    n = 300
    topo = Topology("poison", ft_config.replace(timeout_s=60.0, max_replays=MAX_REPLAYS))

    def prepare(e: dict[str, Any]) -> dict[str, Any]:
        if e["i"] == 5:
            return {**e, "handle": object()}  # msgpack cannot carry it across the key_by exchange
        if e["i"] == 13:
            raise FailRecord("bad input, no use replaying", replay=False)
        return e

    def key(e: dict[str, Any]) -> str:
        if e["i"] == 3:
            raise KeyError("no user for record 3")
        return str(e["user"])

    out = JsonLinesSink(tmp_path / "out")
    topo.source("clicks", clicks(n)).map(prepare).key_by(key).map(lambda e: {**e, "seen": True}).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    drain_and_check_alive(query)
    assert {line["value"]["i"] for line in out.read_all()} == set(range(n)) - {3, 5, 13}
    layer = query.layers[0]
    letters = letters_by_i(layer.dead_letters.list())
    assert sorted(letters) == [3, 5, 13]
    assert "KeyError" in letters[3].reason and "no user for record 3" in letters[3].reason
    assert "cannot serialize" in letters[5].reason or "UnsupportedTypeError" in letters[5].reason
    assert letters[3].replay_count == MAX_REPLAYS and letters[5].replay_count == MAX_REPLAYS
    # the deterministic one went to the dead-letter stream at once: no replay spent on it
    assert letters[13].replay_count == 0 and "bad input, no use replaying" in letters[13].reason
    stats = layer.stats()
    print("poison stats:", {k: stats[k] for k in ("acked", "failed_explicit", "replayed", "dead_lettered")})
    assert stats["acked"] == n - 3 and stats["dead_lettered"] == 3 and stats["replayed"] == 2 * MAX_REPLAYS
    assert stats["pending"] == 0 and stats["failed_waiting"] == 0 and stats["failed_timeout"] == 0
    assert layer.leftovers() == []


def test_keyed_state_that_cannot_be_loaded_or_saved_fails_only_its_record(
    spark: Any, ft_config: FTConfig, redis_client: redis.Redis, tmp_path: Path
) -> None:
    n = 300
    cfg = ft_config.replace(timeout_s=60.0, max_replays=MAX_REPLAYS)
    topo = Topology("pstate", cfg)
    # a stored state that is not msgpack: loading key "broken" fails
    redis_client.hset(state_key(cfg.namespace, "pstate", "counts"), pack_payload("broken"), b"\xc1\xc1")

    def key(e: dict[str, Any]) -> str:
        return "broken" if e["i"] == 9 else str(e["user"])

    def count(state: dict[str, Any], e: dict[str, Any]) -> list[dict[str, Any]]:
        state["n"] = state.get("n", 0) + 1
        if e["i"] == 17:
            state["lock"] = object()  # a state that cannot be saved
        return [{"user": e["user"], "i": e["i"], "n": state["n"]}]

    out = JsonLinesSink(tmp_path / "out")
    topo.source("clicks", clicks(n)).key_by(key).map_with_state(count, name="counts").sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    drain_and_check_alive(query)
    assert {line["value"]["i"] for line in out.read_all()} == set(range(n)) - {9, 17}
    layer = query.layers[0]
    letters = letters_by_i(layer.dead_letters.list())
    assert sorted(letters) == [9, 17]
    assert "state 'counts'" in letters[9].reason and "cannot unpack" in letters[9].reason
    assert "state 'counts'" in letters[17].reason and "cannot serialize" in letters[17].reason
    assert letters[9].replay_count == MAX_REPLAYS and letters[17].replay_count == MAX_REPLAYS
    # the failed record's change was rolled back; the other records of its key were counted
    skey = state_key(cfg.namespace, "pstate", "counts")
    assert redis_client.hget(skey, pack_payload("broken")) == b"\xc1\xc1"  # the bad state was never overwritten
    redis_client.hdel(skey, pack_payload("broken"))
    states = KeyedStateStore(cfg, "pstate", "counts").read_all()
    assert states["u17"] == {"n": len(range(17, n, 37)) - 1}
    assert states["u16"] == {"n": len(range(16, n, 37))}
    stats = layer.stats()
    print("keyed-state poison stats:", {k: stats[k] for k in ("acked", "failed_explicit", "replayed", "dead_lettered")})
    assert stats["acked"] == n - 2 and stats["dead_lettered"] == 2 and stats["pending"] == 0
    assert layer.leftovers() == []


def test_a_stored_frame_that_fails_its_checksum_is_dead_lettered_alone(
    spark: Any, ft_config: FTConfig, redis_client: redis.Redis, tmp_path: Path
) -> None:
    n = 200
    cfg = ft_config.replace(timeout_s=60.0, max_replays=MAX_REPLAYS)
    # persist first, corrupt one stored frame, then start the topology over the same source
    layer = FTLayer(cfg, "pframe", "clicks", num_channels=cfg.num_channels).open()
    records = make_records(layer, clicks(n), key=lambda e: e["user"])  # in chunks, as ingest files them
    layer.persist(records)
    bad = records[7].record_id.source_record_id
    key = chunk_key(bad)
    raw = redis_client.hget(layer.store.keys.chunk_frames, key)
    assert isinstance(raw, bytes)
    _start, end = frame_spans(raw, index_of(bad) + 1)[index_of(bad)]
    flipped = raw[: end - 1] + bytes([raw[end - 1] ^ 0xFF]) + raw[end:]  # a payload bit flip in record 7 alone
    redis_client.hset(layer.store.keys.chunk_frames, key, flipped)

    topo = Topology("pframe", cfg)
    out = JsonLinesSink(tmp_path / "out")
    topo.source("clicks", []).map(lambda e: e).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    drain_and_check_alive(query)
    assert {line["value"]["i"] for line in out.read_all()} == set(range(n)) - {7}
    (letter,) = layer.dead_letters.list()
    assert letter.source_record_id == bad
    assert letter.record is None and "checksum mismatch" in letter.reason
    stats = layer.stats()
    print("corrupt-frame stats:", {k: stats[k] for k in ("acked", "failed_explicit", "replayed", "dead_lettered")})
    # replaying the same corrupt bytes cannot help: dead-lettered without a replay
    assert stats["acked"] == n - 1 and stats["replayed"] == 0 and stats["dead_lettered"] == 1
    assert stats["pending"] == 0 and stats["failed_waiting"] == 0
    assert layer.leftovers() == []

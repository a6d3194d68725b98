"""SourceStore and DeadLetters functions that need no Lua: run on the real server and on fakeredis.

fakeredis's Lua has neither the ``struct`` nor the ``bit`` library, so the
acker scripts themselves run only against the real server (see the other tests).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ftlayer.acker.dead_letters import DeadLetters
from ftlayer.config import FTConfig
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from ftlayer.store.id_blobs import pack_ids, unpack_ids
from ftlayer.store.source_store import SourceStore


@pytest.fixture(params=["real", "fake"])
def any_client(request: pytest.FixtureRequest, redis_server_url: str, namespace: str) -> Iterator[Any]:
    if request.param == "fake":
        fakeredis = pytest.importorskip("fakeredis")
        yield fakeredis.FakeRedis()
        return
    client = redis.Redis.from_url(redis_server_url)
    yield client
    for key in client.scan_iter(match=f"{namespace}:*"):
        client.delete(key)


@pytest.fixture
def store(any_client: Any, namespace: str) -> SourceStore:
    return SourceStore(FTConfig(namespace=namespace), "topo", "src", client=any_client)


def test_pack_ids_roundtrip() -> None:
    ids = [1, -1, 2**63 - 1, -(2**63)]
    assert unpack_ids(pack_ids(ids)) == ids


def test_stats_defaults_and_counts(store: SourceStore) -> None:
    assert store.stats()["acked"] == 0 and store.stats()["pending"] == 0
    store.client.hincrby(store.keys.stats, "acked", 3)
    store.client.incrby(store.keys.live, 1)
    stats = store.stats()
    assert stats["acked"] == 3 and stats["pending"] == 1


def test_register_records_channel_count_once(store: SourceStore) -> None:
    assert store.recorded_channels() is None
    store.register(4)
    store.register(8)
    assert store.recorded_channels() == 4


def test_leftover_keys_ignore_bookkeeping(store: SourceStore) -> None:
    store.client.set(store.keys.gen, 3)
    store.client.set(store.keys.token("abc"), 1)
    store.client.xadd(store.keys.channel(0), {"i": b"x"})
    store.client.xtrim(store.keys.channel(0), maxlen=0, approximate=False)
    store.client.set(store.keys.live, 0)
    assert store.leftover_keys() == []
    store.client.hset(store.keys.chunks, b"123456", b"x")
    assert store.leftover_keys() == ["ck"]
    store.client.incrby(store.keys.live, 1)
    assert store.leftover_keys() == ["ck", "live"]


def test_dead_letters_list_get_purge(store: SourceStore) -> None:
    rec = SemiDeserializedRecord(0, RecordId(5, 6), 42, 5, 3, b"\xa1x", 1)
    frame = SemiDeserializedSerializer().encode(rec)
    for reason in ("first", "second"):
        store.client.xadd(store.keys.dlq, {
            "sid": struct.pack(">q", 5), "failed_ms": "10", "dead_ms": "11", "reason": reason, "frame": frame,
        })
    dlq = DeadLetters(store)
    letters = dlq.list()
    assert [d.reason for d in letters] == ["first", "second"]
    assert letters[0].origin_id == 5 and letters[0].replay_count == 3 and letters[0].record == rec
    assert dlq.get(letters[1].entry_id) == letters[1]
    assert dlq.list(after=letters[0].entry_id) == [letters[1]]
    assert dlq.purge([letters[0].entry_id]) == 1
    assert dlq.count() == 1

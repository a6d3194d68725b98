"""SourceStore.run sends EVALSHA on a pooled connection itself (ftlayer.store.source_store.evalsha):
it must keep what redis-py's Script call and execute_command did, on a real server: NOSCRIPT reloads
the script, a dropped connection is reconnected and the call sent again, an outage within the
budget is ridden out, a script's error still names the source."""

from __future__ import annotations

import gc
import threading

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import AckerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.store.source_store import evalsha
from serialization.payload import pack_payload


def _persist(layer: FTLayer, n: int) -> int:
    return layer.persist_new([pack_payload(i) for i in range(n)], list(range(n)), [i % 2 for i in range(n)])


def test_a_flushed_script_cache_is_reloaded(redis_server_url: str, namespace: str) -> None:
    layer = FTLayer(FTConfig(redis_url=redis_server_url, namespace=namespace), "t", "s", num_channels=2).open()
    assert _persist(layer, 10) == 10
    redis.Redis.from_url(redis_server_url).script_flush()
    assert _persist(layer, 7) == 7  # NOSCRIPT: SCRIPT LOAD, then EVALSHA again
    assert layer.stats()["persisted"] == 17


def test_a_killed_connection_is_reconnected_and_the_call_sent_again(redis_server_url: str, namespace: str) -> None:
    layer = FTLayer(FTConfig(redis_url=redis_server_url, namespace=namespace), "t", "s", num_channels=2).open()
    assert _persist(layer, 5) == 5
    admin = redis.Redis.from_url(redis_server_url)
    mine = [c for c in admin.client_list() if int(c["id"]) != admin.client_id()]
    assert mine
    for entry in mine:  # every other connection, the store's pooled one among them
        admin.client_kill_filter(_id=int(entry["id"]))
    assert _persist(layer, 6) == 6
    assert layer.stats()["persisted"] == 11


def test_a_script_error_names_the_script(redis_server_url: str) -> None:
    client = redis.Redis.from_url(redis_server_url)
    script = client.register_script("return redis.error_reply('ERR boom')")
    with pytest.raises(redis.ResponseError, match="boom"):
        evalsha(client, script, [], [])
    assert evalsha(client, client.register_script("return ARGV[1] .. KEYS[1]"), ["k"], [b"v"]) == b"vk"


def test_a_refused_persist_is_an_acker_error(redis_server_url: str, namespace: str) -> None:
    layer = FTLayer(FTConfig(redis_url=redis_server_url, namespace=namespace), "t", "s", num_channels=2).open()
    from ftlayer.acker.persistence import PERSIST

    with pytest.raises(AckerError, match="PERSIST failed"):
        layer.store.run(PERSIST, [*layer.store.state_keys, layer.keys.token("p:x"), *layer.store.channel_keys(2)],
                        [layer.keys.prefix, 2, b"\x00" * 20, 1000])


def test_each_thread_keeps_its_own_connection_and_gives_it_back_when_it_ends(
        redis_server_url: str, namespace: str) -> None:
    # a pool large enough to keep connections in (redis-py 8's default pool of 100 is not: see _KEEP_MIN_CONNECTIONS)
    client = redis.Redis(connection_pool=redis.ConnectionPool.from_url(redis_server_url, max_connections=1 << 20))
    layer = FTLayer(FTConfig(namespace=namespace), "t", "s", num_channels=2, client=client).open()
    pool = layer.client.connection_pool
    in_use: list[int] = []
    start, measured, leave = threading.Barrier(4), threading.Barrier(4), threading.Barrier(4)

    def persist() -> None:
        start.wait()  # all four at once: four connections in use together
        for _ in range(20):
            assert _persist(layer, 3) == 3
        measured.wait()  # every thread done calling, none ended: each still holds the one it kept
        in_use.append(len(pool._in_use_connections))  # type: ignore[attr-defined]
        leave.wait()

    threads = [threading.Thread(target=persist) for _ in range(4)]
    before = len(pool._in_use_connections)  # type: ignore[attr-defined]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gc.collect()
    assert layer.stats()["persisted"] == 4 * 20 * 3
    assert in_use == [before + 4] * 4  # one kept connection per thread, not one per call
    assert len(pool._in_use_connections) == before  # type: ignore[attr-defined]  # every pin given back


def test_a_pool_with_a_connection_limit_lends_one_per_call(redis_server_url: str, namespace: str) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_server_url, max_connections=1, timeout=2)
    client = redis.Redis(connection_pool=pool)
    layer = FTLayer(FTConfig(namespace=namespace), "t", "s", num_channels=2, client=client).open()
    done: list[int] = []
    persisted, finish = threading.Event(), threading.Event()

    def other() -> None:
        done.append(_persist(layer, 3))
        persisted.set()
        finish.wait(30)  # alive: a connection it kept would still be its own

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert persisted.wait(30)
        assert _persist(layer, 4) == 4  # the pool's one connection came back after the other thread's call
    finally:
        finish.set()
        thread.join(30)
    assert done == [3]
    assert layer.stats()["persisted"] == 7

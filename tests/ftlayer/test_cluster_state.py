"""A source's whole life on a real Valkey Cluster, and the same on a single server.

Every script runs with a ``#!lua`` shebang, so a cluster node refuses any key a script
does not declare ("Attempted to access a non local key"): running every state change
here on the cluster is the check that all scripts declare their keys. The client is
redis-py's RedisCluster, picked by ``ftlayer.store.connection`` from ``INFO cluster``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import DurabilityError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.cluster import EmbeddedCluster
from ftlayer.store.connection import is_cluster
from runtime.chaos.faults import ConnectionDropper
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, commit_all, hand_out


@pytest.fixture(params=["single", "cluster"])
def backend(request: pytest.FixtureRequest, redis_server_url: str) -> tuple[str, str]:
    if request.param == "single":
        return "single", redis_server_url
    cluster: EmbeddedCluster = request.getfixturevalue("valkey_cluster")
    return "cluster", cluster.urls[0]


@pytest.fixture
def cluster_layer(backend: tuple[str, str], clock: FakeClock) -> Iterator[FTLayer]:
    cfg = FTConfig(redis_url=backend[1], namespace=f"t{uuid.uuid4().hex[:10]}", timeout_s=30.0, num_buckets=3,
                   replay_backoff_initial_s=0.0,
                   max_replays=1)
    layer = FTLayer(cfg, "topo", "src", num_channels=4, clock=clock).open()
    yield layer
    for key in layer.store.client.scan_iter(match=f"{cfg.namespace}:*"):
        layer.store.client.delete(key)


def test_every_state_change_runs_on_the_backend(
    cluster_layer: FTLayer, backend: tuple[str, str], clock: FakeClock
) -> None:
    layer = cluster_layer
    assert is_cluster(layer.store.client) == (backend[0] == "cluster")
    recs = [make_record(layer, {"i": i}, key=f"k{i}") for i in range(400)]
    assert layer.persist(recs) == 400
    assert layer.persist(recs[:50]) == 0  # a retried persist files nothing twice
    assert hand_out(layer) == 400
    by_sid = {r.record_id.source_record_id: r for r in recs}
    sids = sorted(by_sid)
    # acks for 200, an explicit fail for 20 (replayed, then dead-lettered), 180 left to time out
    done = layer.ack({s: by_sid[s].record_id.current_record_id for s in sids[:200]})
    assert len(done.acked) == 200
    assert layer.fail(sids[200:220], "bad row") == 20
    assert layer.replay_due().replayed == 20
    assert hand_out(layer) == 200  # a task reads the 180 left and the 20 replays
    for _ in range(layer.config.num_buckets):  # the timeout: every bucket rotates out
        layer.on_timeout()
    assert layer.stats()["failed_timeout"] == 200
    clock.advance(60)
    step = layer.replay_due()  # max_replays = 1: the 20 replays are spent and dead-letter
    assert (step.replayed, step.dead_lettered) == (180, 20)
    assert hand_out(layer) == 180
    for _ in range(layer.config.num_buckets):
        layer.on_timeout()
    clock.advance(60)
    assert layer.replay_due().dead_lettered == 180
    assert layer.pending_count() == 0 and layer.dead_letter_count() == 200
    # requeue them all, then ack them through the DataFrame path's batch settle
    back = layer.requeue_dead_letters([d.entry_id for d in layer.list_dead_letters(count=1000)])
    assert back.requeued == 200 and layer.pending_count() == 200
    requeued_sids = [r.record_id.source_record_id for ch in range(layer.num_channels)
                     for batch in layer.persistence.iter_channel(ch) for r in batch.records()]
    assert len(requeued_sids) == 200
    layer.record_batch_reads("b7", requeued_sids, ("q1", 7))
    assert layer.settle_batch("b7", "ack") == 200
    commit_all(layer)
    stats = layer.stats()
    assert stats["pending"] == 0 and stats["acked"] == 400 and stats["requeued"] == 200
    assert layer.leftovers() == []


def test_replicated_durability_is_refused_without_a_replica(redis_server_url: str) -> None:
    cfg = FTConfig(redis_url=redis_server_url, namespace=f"t{uuid.uuid4().hex[:10]}", durability="replicated")
    with pytest.raises(DurabilityError, match="connected replica"):
        FTLayer(cfg, "topo", "src", num_channels=2).open()


@pytest.mark.slow
def test_replicated_persist_waits_for_a_replica_and_fails_loudly_without_one(tmp_path: Any) -> None:
    """A persist in 'replicated' mode returns only once a replica has the writes: with the
    replica frozen (SIGSTOP), it raises DurabilityError; in 'everysec' the same persist returns."""
    import os
    import signal

    with EmbeddedCluster(primaries=1, replicas=1, data_dir=tmp_path / "cl") as cluster:
        url = cluster.urls[0]
        base = FTConfig(redis_url=url, namespace="rep", waitaof_timeout_ms=500)
        layer = FTLayer(base.replace(durability="replicated"), "topo", "src", num_channels=2).open()
        assert layer.persist([make_record(layer, i) for i in range(100)]) == 100
        (primary,) = cluster.primary_ports()
        (replica,) = cluster.replica_ports(primary)
        with cluster.node_client(replica) as rc:
            rc.execute_command("READONLY")
            assert int(rc.get(layer.store.keys.live)) == 100  # WAIT returned: the replica has them
        pid = next(n.pid for n in cluster.nodes if n.port == replica)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(DurabilityError, match="replica"):
                layer.persist([make_record(layer, i) for i in range(10)])
            plain = FTLayer(base.replace(durability="everysec"), "topo", "src", num_channels=2).open()
            assert plain.persist([make_record(plain, i) for i in range(10)]) == 10
        finally:
            os.kill(pid, signal.SIGCONT)
        assert layer.pending_count() == 120  # written, only unconfirmed: nothing was dropped





def _owning_node(layer: FTLayer) -> tuple[redis.Redis, str]:
    """The node client of the server that owns ``layer``'s source, and that server's URL."""
    node = layer.store.node_client()
    kw = node.connection_pool.connection_kwargs
    return node, f"redis://{kw['host']}:{kw['port']}"


def _storm(url: str, seconds: float) -> tuple[ConnectionDropper, threading.Timer]:
    """The chaos scenarios' dropper at full speed (``CLIENT KILL TYPE normal`` with no pause) on the
    server at ``url``, and a timer that stops it ``seconds`` after the timer starts."""
    dropper = ConnectionDropper(url, interval_s=0.0)
    return dropper, threading.Timer(seconds, dropper.stop)


def test_open_rides_out_a_node_that_drops_every_connection_while_it_checks(valkey_cluster: EmbeddedCluster) -> None:
    """``open()`` checks each owning node's settings over a node client whose own 3 tries take about
    0.2 s. A node that kills every new connection for longer (here 1.5 s of ``CLIENT KILL`` as fast
    as one admin connection can send it, as the chaos scenarios' dropper does every 200 ms) delays
    the start of a query but does not fail it (ci64: ``Connection reset by peer`` in ``open``)."""
    cfg = FTConfig(redis_url=valkey_cluster.urls[0], namespace=f"t{uuid.uuid4().hex[:10]}")
    layer = FTLayer(cfg, "topo", "src", num_channels=2)
    node, url = _owning_node(layer)
    dropper, stop = _storm(url, 1.5)
    node.connection_pool.disconnect()  # the check must open a new connection
    dropper.start()
    stop.start()
    try:
        layer.open()
    finally:
        stop.join()
    assert dropper.killed > 0  # open() above went through the storm and did not fail
    assert layer.store.recorded_channels() == 2
    for key in layer.store.client.scan_iter(match=f"{cfg.namespace}:*"):
        layer.store.client.delete(key)


def test_open_rides_out_dropped_connections_in_its_channel_check(
        valkey_cluster: EmbeddedCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same storm, started as ``open()`` reaches its second step (registering the source, or
    checking its recorded shard and channel counts, on the cluster client): it waits, then registers
    (the fast tier's 4 workers once had the storm outlast the settings check and fail this step)."""
    cfg = FTConfig(redis_url=valkey_cluster.urls[0], namespace=f"t{uuid.uuid4().hex[:10]}")
    layer = FTLayer(cfg, "topo", "src", num_channels=2)
    _node, url = _owning_node(layer)
    dropper, stop = _storm(url, 1.0)
    recorded_shards = layer.store.recorded_shards

    def storm_first() -> int | None:
        if not stop.is_alive() and dropper.killed == 0:  # the first call: the storm begins
            dropper.start()
            stop.start()
            while dropper.killed == 0 and stop.is_alive():
                time.sleep(0.001)
        return recorded_shards()

    monkeypatch.setattr(layer.store, "recorded_shards", storm_first)
    try:
        layer.open()
    finally:
        if stop.ident is not None:
            stop.join()
    assert dropper.killed > 0
    assert layer.store.recorded_channels() == 2
    for key in layer.store.client.scan_iter(match=f"{cfg.namespace}:*"):
        layer.store.client.delete(key)

"""Late completions on a real server (and a real cluster): a DataFrame batch that commits after its
records timed out settles their replays, so an aggregate never counts a record twice.

The clock is injected (FakeClock): timeouts are driven by rotations by hand, nothing sleeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ftlayer.cluster_server import EmbeddedCluster
from ftlayer.config import FTConfig
from ftlayer.layer import FTLayer
from ftlayer.replayer import REPLACED_LINK_TTL_S
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, commit_all


def _persist(layer: FTLayer, n: int, first: int = 0) -> list[int]:
    recs = [make_record(layer, i, key=f"k{i}") for i in range(first, first + n)]
    layer.persist(recs)
    return [r.record_id.source_record_id for r in recs]


def _read(layer: FTLayer, tag: str | None = None) -> list[int]:
    """A batch's read tasks: every channel whole, filing the emitted ids under ``tag``."""
    sids = [sid for shard in layer.shards for ch in range(layer.num_channels)
            for batch in shard.persistence.iter_channel(ch) for sid in batch.pending()[0]]
    if tag is not None:
        layer.record_batch_reads(tag, sids)
    return sids


def _time_out(layer: FTLayer) -> None:
    for _ in range(layer.config.num_buckets):
        layer.on_timeout()


@pytest.fixture(params=["single", "cluster"])
def url(request: pytest.FixtureRequest, redis_server_url: str) -> str:
    if request.param == "cluster":  # the scripts declare the link hash: a cluster refuses any other key
        cluster: EmbeddedCluster = request.getfixturevalue("valkey_cluster")
        return cluster.urls[0]
    return redis_server_url


def _layer(url: str, clock: FakeClock, backoff_s: float) -> FTLayer:
    cfg = FTConfig(redis_url=url, namespace=f"t{uuid.uuid4().hex[:10]}", timeout_s=10.0, num_buckets=3,
                   replay_backoff_initial_s=backoff_s, replay_backoff_max_s=max(backoff_s, 1.0))
    return FTLayer(cfg, "topo", "late", num_channels=2, clock=clock).open()


@pytest.fixture
def layer(url: str, clock: FakeClock) -> Iterator[FTLayer]:
    lay = _layer(url, clock, 0.0)  # timed-out records are replayed at once
    yield lay
    for key in lay.store.client.scan_iter(match=f"{lay.config.namespace}:*"):
        lay.store.client.delete(key)


def test_a_batch_committed_after_its_records_timed_out_settles_their_copies(layer: FTLayer) -> None:
    sids = _persist(layer, 300)
    assert sorted(_read(layer, "b1")) == sorted(sids)
    _time_out(layer)  # the batch ran past its hold: every record timed out
    assert layer.stats()["failed_timeout"] == 300
    assert layer.replay_due().replayed == 300  # the copies wait in the channel streams, unread
    assert layer.pending_count() == 300
    assert layer.settle_batch("b1", "ack") == 300  # the batch committed after all
    stats = layer.stats()
    assert stats["late_completions"] == 300 and stats["acked"] == 300, stats
    assert layer.pending_count() == 0
    assert _read(layer) == []  # the next batch reads no copy: nothing is counted twice
    commit_all(layer)
    assert layer.leftovers() == []


def test_a_record_failed_by_a_row_function_keeps_its_replay(layer: FTLayer) -> None:
    sids = _persist(layer, 100)
    _read(layer, "b1")
    assert layer.fail(sids[:40], "row function raised") == 40  # its row never reached the output
    _time_out(layer)  # the other 60 time out
    assert layer.replay_due().replayed == 100
    assert layer.settle_batch("b1", "ack") == 60
    assert layer.stats()["late_completions"] == 60
    assert len(_read(layer)) == 40  # only the row function's failures are read again


def test_a_replay_still_waiting_for_its_backoff_is_cancelled(url: str, clock: FakeClock) -> None:
    layer = _layer(url, clock, 30.0)
    sids = _persist(layer, 200)
    _read(layer, "b1")
    _time_out(layer)
    client, keys = layer.store.client, layer.store.keys
    assert client.hlen(keys.failed) == 200 and layer.replay_due().replayed == 0  # waiting for its backoff
    assert layer.settle_batch("b1", "ack") == 200
    assert client.hlen(keys.failed) == 0 and client.zcard(keys.due) == 0
    clock.advance(60)
    assert layer.replay_due().replayed == 0
    assert layer.stats()["late_completions"] == 200 and len(sids) == 200


def test_a_copy_that_timed_out_in_turn_is_followed_to_its_own_copy(layer: FTLayer) -> None:
    _persist(layer, 50)
    _read(layer, "b1")
    _time_out(layer)
    assert layer.replay_due().replayed == 50
    assert len(_read(layer)) == 50  # a batch that will never commit reads the copies
    _time_out(layer)
    assert layer.replay_due().replayed == 50  # second copies, unread
    assert layer.settle_batch("b1", "ack") == 50
    assert layer.pending_count() == 0 and _read(layer) == []


def test_links_older_than_their_ttl_are_swept(layer: FTLayer, clock: FakeClock) -> None:
    client, keys = layer.store.client, layer.store.keys
    _persist(layer, 30)
    _read(layer)
    _time_out(layer)
    layer.replay_due()
    assert client.hlen(keys.replaced) == 30 + 1  # the links and the sweep cursor
    assert 0 < client.pttl(keys.replaced) <= REPLACED_LINK_TTL_S * 1000
    clock.advance(REPLACED_LINK_TTL_S + 60)
    _read(layer)  # the copies time out in turn; their replay sweeps the old links
    _time_out(layer)
    layer.replay_due()
    old = {f for f in client.hkeys(keys.replaced) if f != b"~"}
    assert len(old) == 30  # only the new links remain
    assert layer.settle_batch("never-read", "ack") == 0

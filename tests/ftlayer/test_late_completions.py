"""Late completions on a real server (and a real cluster): a DataFrame batch that commits after its
records timed out settles their replays, so an aggregate never counts a record twice.

The clock is injected (FakeClock): timeouts are driven by rotations by hand, nothing sleeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ftlayer.acker.replayer import REPLACED_LINK_TTL_S
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.cluster import EmbeddedCluster
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


def _reread(layer: FTLayer, tag: str) -> list[int]:
    """A later action of batch ``tag`` (the write after a count, a task's retry) reads the channels
    again as the DataFrame read task does: noting the records it finds no longer pending."""
    return [sid for shard in layer.shards for ch in range(layer.num_channels)
            for sid in shard.persistence.read_channel(ch, hold=tag, skips_ttl_ms=60_000).pending()[0]]


Ends = dict[tuple[int, int], str]


def _ends(layer: FTLayer) -> Ends:
    """A batch's end offset: the last stream id of each channel of each shard (its range's end)."""
    out: Ends = {}
    for k, shard in enumerate(layer.shards):
        for ch in range(layer.num_channels):
            last = shard.store.client.xrevrange(shard.store.keys.channel(ch), count=1)
            out[k, ch] = last[0][0].decode() if last else "0-0"
    return out


def _df_read(layer: FTLayer, tag: str, ends: Ends) -> list[int]:
    """One read of every partition of batch ``tag`` (up to ``ends``) as the DataFrame read task
    makes it: counted and noted in ``dfs:<tag>``, its emitted ids filed in ``dfb:<tag>``."""
    sids = [sid for k, shard in enumerate(layer.shards) for ch in range(layer.num_channels)
            for sid in shard.persistence.read_channel(ch, until=ends[k, ch], hold=tag,
                                                      skips_ttl_ms=60_000).pending()[0]]
    layer.record_batch_reads(tag, sids)
    return sids


def _notes(layer: FTLayer, tag: str) -> dict[bytes, bytes]:
    """The skip notes of ``dfs:<tag>`` (chunk id -> bitmap or ``*``), without the read counts."""
    fields: dict[bytes, bytes] = layer.store.client.hgetall(layer.store.keys.batch_skips(tag))
    return {f: v for f, v in fields.items() if len(f) == 6}


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


def test_a_record_a_later_read_of_its_batch_skipped_keeps_its_replay(layer: FTLayer) -> None:
    """foreachBatch counts, the batch hangs, its records time out, then the write reads the batch
    again and finds none of them: completing them late would ack records nothing wrote (chaos
    delayed-acks --pipeline dataframe --sink delta lost 3 that way)."""
    sids = _persist(layer, 100)
    _read(layer, "b1")  # the count
    _time_out(layer)
    assert _reread(layer, "b1") == []  # the write: no record of the batch is pending any more
    assert layer.replay_due().replayed == 100
    assert layer.settle_batch("b1", "ack") == 0  # the batch committed; nothing of it was written
    assert layer.stats()["late_completions"] == 0
    assert len(_read(layer, "b2")) == len(sids)  # the copies (new ids) are read and written instead
    assert layer.settle_batch("b2", "ack") == len(sids)
    commit_all(layer)
    assert layer.leftovers() == []  # dfs:b1 went with the batch key


def test_a_reread_that_finds_every_record_pending_notes_nothing(layer: FTLayer) -> None:
    sids = _persist(layer, 100)
    _read(layer, "b1")
    assert sorted(_reread(layer, "b1")) == sorted(sids)  # a second action, before any timeout
    assert _notes(layer, "b1") == {}
    _time_out(layer)
    assert layer.replay_due().replayed == 100
    assert layer.settle_batch("b1", "ack") == 100
    assert layer.stats()["late_completions"] == 100


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


def test_a_chunk_a_later_read_did_not_see_at_all_keeps_its_replay(layer: FTLayer) -> None:
    """As above, but the timed-out records' chunks are gone and their stream entries trimmed before
    the second read (the FT service's trim_done): that read sees no trace of them, so only the
    read counts tell (chaos delayed-acks --pipeline dataframe --sink postgres lost 3 that way)."""
    sids = _persist(layer, 100)
    b1 = _ends(layer)
    assert sorted(_df_read(layer, "b1", b1)) == sorted(sids)  # the count
    _time_out(layer)
    assert layer.replay_due().replayed == 100
    client, keys = layer.store.client, layer.store.keys
    old_entries = sum(client.xlen(keys.channel(c)) for c in range(layer.num_channels))
    assert layer.persistence.trim_done() > 0  # the first batch's entries, all done, are gone
    assert sum(client.xlen(keys.channel(c)) for c in range(layer.num_channels)) < old_entries
    assert _df_read(layer, "b1", b1) == []  # the write: reads nothing
    assert layer.settle_batch("b1", "ack") == 0  # nothing of the batch was written: nothing completes late
    assert layer.stats()["late_completions"] == 0
    assert len(_df_read(layer, "b2", _ends(layer))) == len(sids)  # the copies
    assert layer.settle_batch("b2", "ack") == len(sids)
    layer.end_hold("b1")
    layer.end_hold("b2")
    commit_all(layer)
    assert layer.leftovers() == []  # dfs:b1 and dfs:b2 went with the batch keys


def test_two_whole_reads_complete_late_what_both_handed_on(layer: FTLayer) -> None:
    sids = _persist(layer, 100)
    b1 = _ends(layer)
    _df_read(layer, "b1", b1)
    _df_read(layer, "b1", b1)  # a second action, before any timeout: both hand on everything
    _time_out(layer)
    assert layer.replay_due().replayed == 100
    assert layer.persistence.trim_done() > 0
    assert layer.settle_batch("b1", "ack") == len(sids)
    assert layer.stats()["late_completions"] == 100 and _read(layer) == []


@pytest.mark.parametrize("replayed", [True, False], ids=["replayed", "waiting"])
def test_a_row_function_failure_after_the_timeout_keeps_its_replay(url: str, clock: FakeClock,
                                                                   replayed: bool) -> None:
    """The row function raises on records whose timeout fired first (the batch ran past its hold):
    the fail is late (the records are no longer pending), yet their rows never reached the output,
    so the batch's commit must not complete them late (CI saw an aggregate 21 counts short)."""
    layer = _layer(url, clock, 0.0 if replayed else 30.0)
    client, keys = layer.store.client, layer.store.keys
    sids = _persist(layer, 100)
    _df_read(layer, "b1", _ends(layer))
    _time_out(layer)
    assert layer.replay_due().replayed == (100 if replayed else 0)
    assert layer.fail(sids[:30], "row function raised") == 0  # late: they timed out already
    assert layer.settle_batch("b1", "ack") == 70  # the other 70 were written: completed late
    assert layer.stats()["late_completions"] == 70
    clock.advance(60)
    if not replayed:
        assert layer.replay_due().replayed == 30  # the 30 the row function failed, and no link to them
        assert all(client.hget(keys.replaced, sid.to_bytes(8, "big", signed=True))[:8] == b"\xff" * 8
                   for sid in sids[:30])
    assert len(_read(layer)) == 30  # their copies flow to the next batch


def test_a_late_fail_of_a_record_its_timeout_did_not_fail_writes_no_mark(layer: FTLayer) -> None:
    """Only a timeout's record can be completed late, so only it gets the mark: a late fail of an
    acked record or of one a row function failed already adds nothing to rpl (which stays bounded
    by the timeout rate)."""
    sids = _persist(layer, 20)
    _df_read(layer, "b1", _ends(layer))
    assert layer.fail(sids[:10], "row function raised") == 10
    assert layer.settle_batch("b1", "ack") == 10  # the other 10
    assert layer.fail(sids, "a retried task's fails") == 0  # all late
    assert layer.store.client.hlen(layer.store.keys.replaced) == 0

"""Virtual shards of one source (num_shards > 1) on a real server: every call routed by shard, nothing
lost or filed twice across them, replays kept in their shard, and the figures summed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from ftlayer.acker.dead_letter_ids import DeadLetterError
from ftlayer.errors import ConfigError, InvalidIdError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.keyspace.shard_tags import key_slot_of
from ftlayer.records.chunks import shard_of
from ftlayer.records.frames import SemiDeserializedSerializer
from ftlayer.status.read_model import sample
from serialization.payload import pack_payload
from tests.ftlayer.conftest import FakeClock, commit_all, hand_out

N = 4
_SER = SemiDeserializedSerializer()


@pytest.fixture
def sharded(make_layer: Callable[..., FTLayer]) -> FTLayer:
    return make_layer(num_shards=N, source="sharded", num_buckets=2, max_replays=1)


def _ingest(layer: FTLayer, n: int) -> list[tuple[int, int]]:
    """n records as ingest files them; returns (sid, cid) of each."""
    payloads = [pack_payload({"i": i}) for i in range(n)]
    chunks = layer.new_chunks(payloads, list(range(n)), [i % layer.num_channels for i in range(n)])
    assert layer.persist_chunks(chunks) == n
    pairs = []
    for shard in layer.shards:
        pairs += [(sid, _SER.decode(f).record_id.current_record_id) for sid, f in shard.persistence.iter_pending()]
    assert len(pairs) == n
    return pairs


def test_each_shard_has_its_own_tag_and_the_records_spread_over_all(sharded: FTLayer) -> None:
    tags = {s.store.keys.tag for s in sharded.shards}
    assert len(tags) == N and len({key_slot_of(f"{{{t}}}") for t in tags}) == N
    assert {s.store.keys.meta for s in sharded.shards} == {sharded.keys.meta}  # meta lives with the source
    pairs = _ingest(sharded, 20_000)
    per_shard = Counter(shard_of(sid, N) for sid, _ in pairs)
    assert sorted(per_shard) == list(range(N)) and min(per_shard.values()) > 20_000 / N / 2
    for shard in sharded.shards:  # a record's chunk is in the shard its id names
        keys = sharded.client.hkeys(shard.store.keys.chunks)
        assert keys and {shard_of(int.from_bytes(k + b"\0\0", "big", signed=True), N) for k in keys} == {shard.index}
    assert sharded.pending_count() == 20_000 == sharded.stats()["pending"]


def test_acks_and_fails_are_split_by_shard_and_everything_drains(sharded: FTLayer) -> None:
    pairs = _ingest(sharded, 3000)
    failing = {sid for sid, _ in pairs[::100]}
    result = sharded.xor({sid: cid for sid, cid in pairs if sid not in failing},
                         fails=dict.fromkeys(failing, "boom"), token="t1")
    assert len(result.acked) == 3000 - len(failing) and result.failed == len(failing)
    again = sharded.xor({sid: cid for sid, cid in pairs if sid not in failing}, token="t1")
    assert not again.applied and again.acked == []  # each shard saw the token
    assert sharded.pending_of([sid for sid, _ in pairs[:5]]) == [False] * 5
    result = sharded.replay_due()
    assert result.replayed == len(failing)
    replays = [(sid, _SER.decode(f)) for sh in sharded.shards for sid, f in sh.persistence.iter_pending()]
    assert len(replays) == len(failing)
    for sid, rec in replays:  # a replay stays in its origin's shard
        assert shard_of(sid, N) == shard_of(rec.origin_id, N) and rec.replay_count == 1
    assert len(sharded.complete({sid: rec.record_id.current_record_id for sid, rec in replays}).acked) == len(failing)
    commit_all(sharded)
    assert sharded.pending_count() == 0 and sharded.leftovers() == []


def test_timeouts_fail_in_every_shard_and_dead_letters_name_their_shard(sharded: FTLayer, clock: FakeClock) -> None:
    _ingest(sharded, 400)
    assert hand_out(sharded) == 400
    service = FTService([sharded], clock=clock, tick_s=0.01)
    service.tick()  # every shard's lease, schedule set
    for _ in range(2 * sharded.config.num_buckets + 2):
        clock.advance(sharded.config.rotation_interval_s)
        service.tick()
        hand_out(sharded)  # the replays are read too, so they time out in turn
    stats = sharded.stats()
    assert stats["failed_timeout"] == 800 and stats["dead_lettered"] == 400 and stats["pending"] == 0
    letters = sharded.list_dead_letters(count=1000)
    assert len(letters) == 400 and sharded.dead_letter_count() == 400
    assert {int(d.entry_id.rpartition("@")[2]) for d in letters} == set(range(N))
    for d in letters:
        assert shard_of(d.source_record_id, N) == int(d.entry_id.rpartition("@")[2])
    assert [d.entry_id for d in letters] == sorted((d.entry_id for d in letters),
                                                   key=lambda e: (*map(int, e.split("@")[0].split("-")), int(e[-1])))
    page1 = sharded.list_dead_letters(count=150)
    page2 = sharded.list_dead_letters(count=1000, after=page1[-1].entry_id)
    assert [d.entry_id for d in page1 + page2] == [d.entry_id for d in letters]  # a cursor across shards
    one = letters[7]
    assert sharded.get_dead_letter(one.entry_id) == one
    with pytest.raises(DeadLetterError, match="name its shard"):
        sharded.get_dead_letter(one.entry_id.partition("@")[0])
    assert sharded.requeue_dead_letters([d.entry_id for d in letters[:10]]).requeued == 10
    assert sharded.purge_dead_letters([d.entry_id for d in letters[10:20]]) == 10
    assert sharded.dead_letter_count() == 380 and sharded.pending_count() == 10
    snap = sample(sharded.client, sharded.config.namespace, [("topo", "sharded")])
    (st,) = snap.sources
    assert (st.pending, st.dead_letters, st.counters["requeued"]) == (10, 380, 10)
    service.stop()


def test_batch_acks_settle_every_shard(sharded: FTLayer) -> None:
    pairs = _ingest(sharded, 1000)
    sharded.record_batch_reads("b3", [sid for sid, _ in pairs[:600]], ("q", 3))
    assert sharded.settle_batch("b3", "ack") == 600
    assert sharded.pending_count() == 400


def test_the_shard_count_is_fixed_when_a_source_registers(make_layer: Callable[..., FTLayer]) -> None:
    make_layer(num_shards=N, source="fixed")
    with pytest.raises(ConfigError, match="num_shards = 4"):
        make_layer(num_shards=2, source="fixed")
    make_layer(source="one")  # a one-shard source (or one registered before shards) is shard count 1
    with pytest.raises(ConfigError, match="num_shards = 1"):
        make_layer(num_shards=N, source="one")


def test_a_drained_sharded_source_may_change_its_channel_count(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(num_shards=N, source="resc", num_channels=2)
    pairs = _ingest(layer, 100)
    from ftlayer.errors import ChannelCountMismatchError

    with pytest.raises(ChannelCountMismatchError):
        make_layer(num_shards=N, source="resc", num_channels=3)
    layer.ack(dict(pairs))
    again = make_layer(num_shards=N, source="resc", num_channels=3)
    assert again.recorded_channels() == 3


def test_bad_ids_are_refused_whole_with_shards(sharded: FTLayer) -> None:
    """One bad id among good ones of every shard: the call is refused and no shard applied its part."""
    good = dict(_ingest(sharded, 100))
    with pytest.raises(InvalidIdError, match="nothing was applied"):
        sharded.xor({**good, "x": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidIdError):
        sharded.pending_of([*good, "x"])  # type: ignore[list-item]
    assert sharded.pending_count() == 100 and all(sharded.pending_of(list(good)))
    assert len(sharded.ack(good).acked) == 100  # the refused acks were not applied: these complete


def test_an_out_of_range_id_in_a_later_shard_is_refused_whole(sharded: FTLayer) -> None:
    good = dict(_ingest(sharded, 100))
    bad = 2**63 + ((N - 1) << 56)  # not a signed 64-bit id; its top byte routes it to the last shard
    assert shard_of(bad, N) == N - 1
    with pytest.raises(InvalidIdError, match="nothing was applied"):
        sharded.xor({**good, bad: 1})
    assert sharded.pending_count() == 100


def test_two_ingest_workers_write_disjoint_shards_and_lose_nothing(make_layer: Callable[..., FTLayer]) -> None:
    workers = [make_layer(num_shards=N, source="par") for _ in range(2)]
    taken = [w.write_shards(i, 2) for i, w in enumerate(workers)]
    assert taken == [[0, 2], [1, 3]]
    for i, w in enumerate(workers):
        payloads = [pack_payload({"w": i, "n": n}) for n in range(3000)]
        assert w.persist_chunks(w.new_chunks(payloads, list(range(3000)), [n % 2 for n in range(3000)])) == 3000
    for i, w in enumerate(workers):
        shards = {shard_of(sid, N) for k in taken[i] for sid, _ in w.shards[k].persistence.iter_pending()}
        assert shards == set(taken[i])
    assert workers[0].pending_count() == 6000
    pairs = [(sid, _SER.decode(f).record_id.current_record_id)
             for sh in workers[0].shards for sid, f in sh.persistence.iter_pending()]
    assert len({sid for sid, _ in pairs}) == 6000
    assert len(workers[1].ack(dict(pairs)).acked) == 6000 and workers[0].pending_count() == 0

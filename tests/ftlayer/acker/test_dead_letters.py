"""DeadLetters: listing, requeue (atomic move back into the stream) and purge (real server)."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from ftlayer.acker.dead_letter_ids import DeadLetterError
from ftlayer.acker.dead_letter_requeue import REQUEUE
from ftlayer.config import FTConfig
from ftlayer.errors import AckerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunks import pack_chunks
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from ftlayer.records.keyhash import pmod
from ftlayer.records.lineage import lineage_id
from serialization.serializers import make_record
from tests.ftlayer.conftest import commit_all

_SER = SemiDeserializedSerializer()


def _dead_letter(layer: FTLayer, values: list[object]) -> list[SemiDeserializedRecord]:
    """Persist records and fail them until the layer's max_replays dead-letters them."""
    recs = [make_record(layer, v, key=f"key-{v}") for v in values]
    layer.persist(recs)
    origins = {r.origin_id for r in recs}
    for _ in range(layer.config.max_replays + 1):
        live = [r for r in _pending(layer) if r.origin_id in origins]
        layer.fail([r.record_id.source_record_id for r in live], "poison")
        layer.replay_due()
    assert layer.dead_letters.count() == len(recs) and not any(r.origin_id in origins for r in _pending(layer))
    return recs


def _pending(layer: FTLayer) -> list[SemiDeserializedRecord]:
    return [_SER.decode(frame) for _sid, frame in layer.iter_pending()]


def test_requeue_is_a_fresh_record_with_the_same_origin_payload_key_and_channel(
    make_layer: Callable[..., FTLayer],
) -> None:
    layer = make_layer(max_replays=2)
    recs = _dead_letter(layer, ["a", "b"])
    dl = layer.dead_letters
    assert {d.replay_count for d in dl.list()} == {2}
    by_origin = {d.origin_id: d.entry_id for d in dl.list()}
    result = dl.requeue([by_origin[recs[0].origin_id]], layer.num_channels)
    assert (result.requeued, result.missing, result.undecodable) == (1, [], [])
    assert dl.count() == 1 and layer.stats()["requeued"] == 1
    (new,) = _pending(layer)
    old = recs[0]
    assert (new.origin_id, new.payload, new.key_hash, new.channel, new.source_id) == (
        old.origin_id, old.payload, old.key_hash, old.channel, old.source_id,
    )
    assert new.replay_count == 0 and old.record_id.source_record_id != new.record_id.source_record_id
    # a new tree (new source record id) under the same root current id: every output keeps its
    # lineage id (ftlayer.records.lineage), so an effectively-once sink drops what an earlier attempt wrote
    assert new.record_id.current_record_id == old.record_id.current_record_id
    assert lineage_id(new.origin_id, new.record_id.current_record_id) == lineage_id(
        old.origin_id, old.record_id.current_record_id)
    assert layer.acker.value(new.record_id.source_record_id) == new.record_id.current_record_id


def test_requeued_record_completes_without_leftovers(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=0)
    _dead_letter(layer, ["a"])
    dl = layer.dead_letters
    assert dl.requeue([d.entry_id for d in dl.list()], layer.num_channels).requeued == 1
    (new,) = _pending(layer)
    layer.ack({new.record_id.source_record_id: new.record_id.current_record_id})
    commit_all(layer)
    assert layer.leftovers() == []


def test_requeued_record_can_fail_and_dead_letter_again(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=0)
    _dead_letter(layer, ["a"])
    dl = layer.dead_letters
    dl.requeue([d.entry_id for d in dl.list()], layer.num_channels)
    (new,) = _pending(layer)
    layer.fail([new.record_id.source_record_id], "still poison")
    assert layer.replay_due().dead_lettered == 1
    (again,) = dl.list()
    assert again.reason == "still poison" and again.origin_id == new.origin_id


def test_channel_falls_back_to_the_key_when_it_no_longer_exists(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=0)
    rec = make_record(layer, "x", key="k", channel=3)
    layer.persist([rec])
    layer.fail([rec.record_id.source_record_id], "poison")
    layer.replay_due()
    dl = layer.dead_letters
    assert dl.requeue([d.entry_id for d in dl.list()], 2).requeued == 1
    (new,) = _pending(layer)
    assert new.channel == pmod(rec.key_hash, 2)


def test_missing_undecodable_and_invalid_ids(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=0)
    _dead_letter(layer, ["a"])
    client, k = layer.store.client, layer.store.keys
    bad = client.xadd(k.dlq, {"sid": struct.pack(">q", 7), "reason": "x", "frame": b"garbage"}).decode()
    dl = layer.dead_letters
    good = next(d.entry_id for d in dl.list() if d.record is not None)
    result = dl.requeue([good, bad, "1-1"], layer.num_channels)
    assert (result.requeued, result.missing, result.undecodable) == (1, ["1-1"], [bad])
    assert [d.entry_id for d in dl.list()] == [bad]  # undecodable entries are never dropped
    with pytest.raises(DeadLetterError, match="invalid dead-letter entry id"):
        dl.requeue(["1-1", "nope"], layer.num_channels)
    with pytest.raises(DeadLetterError):
        dl.purge(["*"])


def test_requeue_script_skips_entries_already_gone_and_is_all_or_nothing(
    make_layer: Callable[..., FTLayer],
) -> None:
    layer = make_layer(max_replays=0)
    (rec,) = _dead_letter(layer, ["a"])
    store, k = layer.store, layer.store.keys
    requeue_keys = [*store.state_keys, k.dlq, *store.channel_keys(layer.num_channels)]
    (entry,) = layer.dead_letters.list()
    new = SemiDeserializedRecord(rec.source_id, make_record(layer, "z").record_id, rec.key_hash, rec.origin_id, 0,
                                 rec.payload, rec.channel)
    (chunk,) = pack_chunks([_SER.encode(new)])
    eids = struct.pack(">H", len(entry.entry_id)) + entry.entry_id.encode()
    with pytest.raises(AckerError, match="out of range"):
        n = 1 if rec.channel else 0
        store.run(REQUEUE, [*store.state_keys, k.dlq, *store.channel_keys(n)], [k.prefix, n, chunk.blob, eids])
    with pytest.raises(AckerError, match="truncated"):
        store.run(REQUEUE, requeue_keys, [k.prefix, layer.num_channels, chunk.blob[:-50], eids])
    assert layer.dead_letters.count() == 1 and layer.pending_count() == 0
    # a concurrent purge wins: the entry is gone, nothing is persisted
    layer.dead_letters.purge([entry.entry_id])
    assert store.run(REQUEUE, requeue_keys, [k.prefix, layer.num_channels, chunk.blob, eids]) == 0
    assert layer.pending_count() == 0 and layer.stats()["requeued"] == 0


def test_requeue_never_drops_an_entry_whose_new_id_is_taken(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=0)
    (rec,) = _dead_letter(layer, ["a"])
    live = make_record(layer, "live")
    layer.persist([live])
    store, k = layer.store, layer.store.keys
    requeue_keys = [*store.state_keys, k.dlq, *store.channel_keys(layer.num_channels)]
    (entry,) = layer.dead_letters.list()
    eids = struct.pack(">H", len(entry.entry_id)) + entry.entry_id.encode()
    # a chunk id in use by other records: nothing is written (ftlayer's requeue draws again)
    clash = SemiDeserializedRecord(rec.source_id, RecordId(live.record_id.source_record_id, 77), rec.key_hash,
                                   rec.origin_id, 0, rec.payload, rec.channel)
    (chunk,) = pack_chunks([_SER.encode(clash)])
    assert store.run(REQUEUE, requeue_keys, [k.prefix, layer.num_channels, chunk.blob, eids])[0] == -1
    assert layer.dead_letters.count() == 1 and layer.pending_count() == 1
    # the very same pending record (same ids): taken for a repeat, files nothing and keeps the entry
    same = SemiDeserializedRecord(rec.source_id, live.record_id, rec.key_hash, rec.origin_id, 0, rec.payload,
                                  rec.channel)
    (chunk,) = pack_chunks([_SER.encode(same)])
    assert store.run(REQUEUE, requeue_keys, [k.prefix, layer.num_channels, chunk.blob, eids]) == 0
    assert layer.dead_letters.count() == 1 and layer.pending_count() == 1
    # the public requeue draws fresh ids, whatever is pending
    assert layer.requeue_dead_letters([entry.entry_id]).requeued == 1
    assert layer.dead_letters.count() == 0 and layer.pending_count() == 2


def test_purge_deletes_exactly_the_given_ids(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=0)
    _dead_letter(layer, ["a", "b", "c"])
    dl = layer.dead_letters
    ids = [d.entry_id for d in dl.list()]
    assert dl.purge([]) == 0 and dl.purge([ids[1], "1-1"]) == 1
    assert [d.entry_id for d in dl.list()] == [ids[0], ids[2]]


def test_add_sets_aside_an_unprocessable_record(ft_config: FTConfig) -> None:
    layer = FTLayer(ft_config, "topo", "add", num_channels=2).open()
    rec = make_record(layer, {"bad": "key"}, channel=0)
    entry = layer.dead_letters.add(rec, "KeyError: 'user' in key selector")
    got = layer.dead_letters.get(entry)
    assert got is not None and got.record == rec and got.reason.startswith("KeyError")
    assert layer.stats()["dead_lettered"] == 1 and layer.pending_count() == 0

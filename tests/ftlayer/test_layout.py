"""A source written by an older ftlayer is migrated on open, and its records still time out, fail and
replay (real server). Format 1: a list per bucket generation; format 2: one ``pend`` entry per record;
both are written here by format 2's own PERSIST script (``legacy_format2``)."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable

import pytest

from ftlayer import layout
from ftlayer.errors import ConfigError
from ftlayer.frames import SemiDeserializedSerializer
from ftlayer.keys import FORMAT_VERSION
from ftlayer.layer import FTLayer
from ftlayer.layout import ensure_layout
from serialization.payload import unpack_payload
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, hand_out
from tests.ftlayer.legacy_format2 import persist_v2

_SER = SemiDeserializedSerializer()


def _format_2_source(layer: FTLayer) -> dict[int, int]:
    """30 records in format 2 over two bucket generations, 3 of them with a partial XOR and 2 replays
    deep; returns origin -> replay count."""
    recs = [make_record(layer, {"i": i}, key=f"k{i}") for i in range(20)]
    recs[:2] = [r.replayed(make_record(layer, 0).record_id, r.channel) for r in recs[:2]]
    persist_v2(layer, [_SER.encode(r) for r in recs],
               partial={r.record_id.source_record_id: 12345 for r in recs[5:8]})
    layer.store.client.set(layer.store.keys.gen, 1)  # a second generation, as a rotation made it
    more = [make_record(layer, {"i": i}, key=f"k{i}") for i in range(20, 30)]
    persist_v2(layer, [_SER.encode(r) for r in more])
    return {r.origin_id: r.replay_count for r in recs + more}


def _downgrade_to_format_1(layer: FTLayer) -> dict[int, int]:
    """Rewrite ``bkt`` as format 1 wrote it: ``bkt:<gen>`` lists of bare packed ids."""
    client, k = layer.store.client, layer.store.keys
    per_gen: dict[int, int] = {}
    for element in client.lrange(k.buckets, 0, -1):  # type: ignore[union-attr]
        (gen,) = struct.unpack(">I", element[:4])
        client.rpush(k.key(f"bkt:{gen}"), element[4:])
        per_gen[gen] = per_gen.get(gen, 0) + 1
    client.delete(k.buckets)
    client.hset(k.meta, "format", 1)
    return per_gen


def _pending(layer: FTLayer) -> dict[int, int]:
    """origin -> replay count of every record pending now (decoded from the chunks)."""
    recs = [_SER.decode(frame) for _sid, frame in layer.persistence.iter_pending()]
    counts = Counter(r.origin_id for r in recs)
    assert max(counts.values(), default=1) == 1, "a record was filed twice"
    return {r.origin_id: r.replay_count for r in recs}


def _check_migrated_and_alive(again: FTLayer, before: dict[int, int], clock: FakeClock) -> None:
    client, k = again.store.client, again.store.keys
    assert client.hget(k.meta, "format") == str(FORMAT_VERSION).encode()
    assert not client.exists(k.pend) and list(client.scan_iter(match=k.key("bkt:*"))) == []
    assert _pending(again) == before  # each record once, origin and replay count kept
    assert again.pending_count() == len(before)
    # every channel entry now names chunks: the records are read back where their key routes them
    assert hand_out(again) == len(before)
    for _ in range(again.config.num_buckets + 1):
        again.on_timeout()
    assert again.stats()["failed_timeout"] == len(before)  # nothing filed before the upgrade was lost
    clock.advance(60)
    result = again.replay_due()
    assert result.replayed + result.dead_lettered == len(before)
    assert ensure_layout(again.store) == FORMAT_VERSION  # a second call changes nothing


def test_a_format_2_source_is_migrated_into_chunks_and_its_records_still_time_out(
    make_layer: Callable[..., FTLayer], clock: FakeClock
) -> None:
    old = FTLayer(make_layer().config, "topo", "old", num_channels=4)  # not opened: format 2 is written by hand
    old.store.register(4)
    before = _format_2_source(old)
    again = make_layer(source="old", num_buckets=3, max_replays=3)  # a new process opens the old data
    _check_migrated_and_alive(again, before, clock)
    values = sorted(unpack_payload(_SER.decode(f).payload)["i"] for _, f in again.persistence.iter_pending())
    assert values == list(range(30))  # replayed, each once, under new chunks


def test_a_format_1_source_is_migrated_in_two_steps(make_layer: Callable[..., FTLayer], clock: FakeClock) -> None:
    old = FTLayer(make_layer().config, "topo", "old1", num_channels=4)
    old.store.register(4)
    before = _format_2_source(old)
    assert sorted(_downgrade_to_format_1(old)) == [0, 1]
    again = make_layer(source="old1", num_buckets=3, max_replays=3)
    _check_migrated_and_alive(again, before, clock)


def test_a_migration_cut_off_part_way_goes_on_and_files_nothing_twice(
    make_layer: Callable[..., FTLayer], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = FTLayer(make_layer().config, "topo", "cut", num_channels=4)
    old.store.register(4)
    before = _format_2_source(old)
    monkeypatch.setattr(layout, "_MIGRATE_BATCH", 7)
    real_move, calls = layout._move, []

    def dying_move(*args: object, **kw: object) -> int:
        calls.append(1)
        if len(calls) == 3:
            msg = "the process died here"
            raise RuntimeError(msg)
        return real_move(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(layout, "_move", dying_move)
    with pytest.raises(RuntimeError, match="died"):
        make_layer(source="cut")
    client, k = old.store.client, old.store.keys
    assert client.hget(k.meta, "format") == b"2" and client.hlen(k.pend) == len(before) - 14
    assert len(_pending(old)) == 14  # moved so far, each in one place only
    monkeypatch.setattr(layout, "_move", real_move)
    again = make_layer(source="cut", num_buckets=3, max_replays=3)
    _check_migrated_and_alive(again, before, clock)


def test_a_newer_format_is_refused_and_left_alone(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer()
    layer.store.client.hset(layer.store.keys.meta, "format", FORMAT_VERSION + 1)
    with pytest.raises(ConfigError, match="upgrade ftlayer"):
        make_layer()
    assert layer.store.client.hget(layer.store.keys.meta, "format") == str(FORMAT_VERSION + 1).encode()

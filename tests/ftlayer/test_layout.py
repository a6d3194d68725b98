"""A source written by an older ftlayer (layout format 1: a list per bucket generation) is
migrated on open, and its records still time out, fail and replay (real server)."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

from ftlayer.errors import ConfigError
from ftlayer.keys import FORMAT_VERSION
from ftlayer.layer import FTLayer
from ftlayer.layout import ensure_layout
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, hand_out


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


def test_a_format_1_source_is_migrated_and_its_records_still_time_out(
    make_layer: Callable[..., FTLayer], clock: FakeClock
) -> None:
    layer = make_layer(num_buckets=3, max_replays=1)
    layer.persist([make_record(layer, i) for i in range(20)])
    layer.on_timeout()  # a second generation, so the migration has to keep their order
    layer.persist([make_record(layer, i) for i in range(20, 30)])
    assert hand_out(layer) == 30
    per_gen = _downgrade_to_format_1(layer)
    assert sorted(per_gen) == [0, 1]

    again = make_layer(num_buckets=3, max_replays=1)  # a new process opens the old data
    client, k = again.store.client, again.store.keys
    assert client.hget(k.meta, "format") == str(FORMAT_VERSION).encode()
    assert list(client.scan_iter(match=k.key("bkt:*"))) == []
    gens = [struct.unpack(">I", e[:4])[0] for e in client.lrange(k.buckets, 0, -1)]  # type: ignore[union-attr]
    assert gens == sorted(gens) and set(gens) == {0, 1}
    for _ in range(again.config.num_buckets + 1):
        again.on_timeout()
    assert again.stats()["failed_timeout"] == 30  # nothing filed before the upgrade was lost
    clock.advance(60)
    assert again.replay_due().replayed == 30
    assert ensure_layout(again.store) == FORMAT_VERSION  # a second call changes nothing


def test_a_newer_format_is_refused_and_left_alone(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer()
    layer.store.client.hset(layer.store.keys.meta, "format", FORMAT_VERSION + 1)
    with pytest.raises(ConfigError, match="upgrade ftlayer"):
        make_layer()
    assert layer.store.client.hget(layer.store.keys.meta, "format") == str(FORMAT_VERSION + 1).encode()

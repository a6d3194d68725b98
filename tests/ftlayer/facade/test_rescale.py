"""Changing num_channels: refused while records are in flight, done once the source is drained."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ftlayer.errors import ChannelCountMismatchError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import pmod
from serialization.serializers import make_record
from tests.ftlayer.conftest import commit_all


def _ack_all(layer: FTLayer, recs: list) -> None:  # type: ignore[type-arg]
    layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs})


def test_num_channels_can_change_after_a_full_drain(make_layer: Callable[..., FTLayer]) -> None:
    old = make_layer(num_channels=4)
    recs = [make_record(old, i, key=f"k{i}") for i in range(40)]
    old.persist(recs)
    with pytest.raises(ChannelCountMismatchError, match="still has 40 pending") as info:
        make_layer(num_channels=3)
    assert "num_channels=4" in str(info.value) and "new checkpoint" in str(info.value)
    _ack_all(old, recs)  # drained: nothing pending, nothing waiting for replay
    new = make_layer(num_channels=3)
    assert new.store.recorded_channels() == 3
    more = [make_record(new, i, key=f"k{i}") for i in range(30)]
    assert new.persist(more) == 30
    assert sum(len(new.persistence.read_channel(c).records()) for c in range(3)) == 30
    assert all(r.channel == pmod(r.key_hash, 3) for c in range(3) for r in new.persistence.read_channel(c).records())
    _ack_all(new, more)
    commit_all(new)
    assert new.leftovers() == []  # the old channel streams were emptied, not left behind
    assert make_layer(num_channels=4).store.recorded_channels() == 4  # and back, once drained again


def test_records_waiting_for_replay_block_a_channel_change(make_layer: Callable[..., FTLayer]) -> None:
    old = make_layer(num_channels=2)
    rec = make_record(old, "x", key="k")
    old.persist([rec])
    old.fail([rec.record_id.source_record_id])
    with pytest.raises(ChannelCountMismatchError, match="1 failed records waiting for replay"):
        make_layer(num_channels=5)
    assert old.store.recorded_channels() == 2


def test_a_keyed_dead_letter_requeued_after_a_change_follows_the_new_count(
    make_layer: Callable[..., FTLayer],
) -> None:
    old = make_layer(num_channels=4, max_replays=0)
    rec = make_record(old, "poison", key="user-7")
    old.persist([rec])
    old.fail([rec.record_id.source_record_id])
    old.replay_due()  # max_replays=0: straight to the dead-letter queue, which does not block a change
    new = make_layer(num_channels=3, max_replays=0)
    entry = new.dead_letters.list()[0].entry_id
    assert new.dead_letters.requeue([entry], 3).requeued == 1
    want = pmod(rec.key_hash, 3)
    assert [r.record_id.source_record_id for r in new.persistence.read_channel(want).records()] != []

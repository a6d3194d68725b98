"""Replays of a keyless source spread over the channels as its live records do (issue 13, item 9).

Real server; the source's FTLayer is built the way a running topology builds it
(``runtime.spark.compile.source_layer``) and fed by the real Ingestor.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedSerializer
from runtime.driver.ingest import Ingestor
from runtime.spark.compile import source_layer
from runtime.topology import Topology
from tests.ftlayer.acker.test_rotation_faults import FaultyRedis

N, CHANNELS = 4_000, 4
_SER = SemiDeserializedSerializer()


def layer_for(ft_config: FTConfig, *, key: Any = None, client: redis.Redis | None = None) -> FTLayer:
    topo = Topology("replays")
    topo.source("events", range(N), key=key)
    node = topo._graph.sources[0]
    return source_layer(ft_config, topo.name, node, CHANNELS, client=client)


def channels_of_pending(layer: FTLayer) -> Counter[int]:
    """Channel of every pending record, from its persisted frame."""
    return Counter(_SER.decode(frame).channel or 0 for _sid, frame in layer.persistence.iter_pending())


def ingest(layer: FTLayer, key: Any = None) -> None:
    ingestor = Ingestor(layer, range(N), key=key).start()
    deadline = 0
    while not ingestor.done and deadline < 600:
        ingestor._done.wait(0.1)
        deadline += 1
    ingestor.stop()
    assert layer.pending_count() == N


def fail_all_and_replay(layer: FTLayer) -> None:
    sids = [sid for sid, _frame in layer.persistence.iter_pending()]
    assert layer.fail(sids, "boom") == N
    result = layer.replay_due()
    assert result.replayed == N and layer.pending_count() == N


def test_keyless_replays_land_on_every_channel_like_live_records(
    ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    layer = layer_for(ft_config).open()
    ingest(layer)
    live = channels_of_pending(layer)
    fail_all_and_replay(layer)
    replayed = channels_of_pending(layer)
    print(f"\nkeyless source, {N} records over {CHANNELS} channels: live {dict(sorted(live.items()))}, "
          f"replays {dict(sorted(replayed.items()))}")
    assert set(live) == set(replayed) == set(range(CHANNELS))
    for c in range(CHANNELS):  # both round robin: each channel within 1 of N / n
        assert abs(live[c] - N / CHANNELS) <= 1
        assert abs(replayed[c] - N / CHANNELS) <= 1


def test_keyed_replays_still_go_to_the_live_channel(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = layer_for(ft_config, key=lambda v: f"k{v % 7}").open()
    ingest(layer, key=lambda v: f"k{v % 7}")
    live = channels_of_pending(layer)
    fail_all_and_replay(layer)
    assert channels_of_pending(layer) == live


def test_a_replay_call_retried_after_a_lost_reply_replays_each_record_once(
    ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    client = FaultyRedis.from_url(ft_config.redis_url or "")
    layer = layer_for(ft_config, client=client).open()
    ingest(layer)
    sids = [sid for sid, _frame in layer.persistence.iter_pending()]
    layer.fail(sids, "boom")
    client.arm("REPLAY", "after")  # the server replays the first chunk, the reply is lost
    try:
        layer.replayer.replay_due()
    except FTLayerError:
        pass
    else:
        raise AssertionError("the injected fault did not fire")
    layer.replay_due()  # the retry builds new frames; the chunk already replayed is skipped
    stats = layer.stats()
    assert stats["replayed"] == N and layer.pending_count() == N and stats["failed_waiting"] == 0

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunks import frame_spans
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer

_SER = SemiDeserializedSerializer()


def chunk_records(frames: bytes | bytearray | memoryview, n: int) -> Iterator[SemiDeserializedRecord]:
    """The records of a chunk's ``n`` frames as the reader takes them: each entry found by
    ``ftlayer.records.chunks.frame_spans``, then decoded alone (every frame checked). Lazy: the records
    before a bad frame are yielded, then ``FrameError``."""
    for start, end in frame_spans(frames, n):
        yield _SER.decode(frames[start:end])


class FakeClock:
    """Injectable wall clock (seconds) for tests that must not sleep."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_layer(ft_config: FTConfig, clock: FakeClock, redis_client: Any) -> Callable[..., FTLayer]:
    def build(**overrides: Any) -> FTLayer:
        source = overrides.pop("source", "src")
        channels = overrides.pop("num_channels", 4)
        router = overrides.pop("replay_router", None)
        owner = overrides.pop("owner", None)
        cfg = ft_config.replace(**overrides) if overrides else ft_config
        return FTLayer(
            cfg, "topo", source, num_channels=channels, clock=clock, replay_router=router, owner=owner
        ).open()

    return build


@pytest.fixture
def layer(make_layer: Callable[..., FTLayer]) -> FTLayer:
    return make_layer()


def commit_all(layer: FTLayer) -> None:
    """What a committed micro-batch does: trim every channel stream to its tail."""
    for ch in range(layer.num_channels):
        layer.trim_channel(ch)  # every shard's stream of the channel


def hand_out(layer: FTLayer) -> int:
    """What a Spark task's read does: read every channel whole (in bounded calls), which marks the
    records as handed out (only those time out and spend a replay; see ``EXPIRE``). Returns the
    records read."""
    return sum(
        len(batch.frames) for shard in layer.shards for ch in range(layer.num_channels)
        for batch in shard.persistence.iter_channel(ch)
    )

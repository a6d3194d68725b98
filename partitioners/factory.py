"""Build a partitioner from a strategy name: the counterpart of ReplayPartitionerFactory."""

from __future__ import annotations

from ftlayer.errors import PartitioningError
from partitioners.base import Partitioner, ReplayPartitioner
from partitioners.strategies import (
    FieldsPartitioner,
    GlobalPartitioner,
    RebalancePartitioner,
    ShufflePartitioner,
)

_CLASSES: dict[str, type[Partitioner]] = {
    cls.strategy: cls
    for cls in (
        FieldsPartitioner,
        RebalancePartitioner,
        ShufflePartitioner,
            GlobalPartitioner,
        )
}

STRATEGIES: tuple[str, ...] = tuple(_CLASSES)
"""Every known strategy name, in a fixed order."""


def partitioner_class(strategy: str) -> type[Partitioner]:
    """The class implementing ``strategy``; unknown names raise :class:`PartitioningError`."""
    try:
        return _CLASSES[strategy]
    except (KeyError, TypeError):
        known = ", ".join(repr(s) for s in STRATEGIES)
        msg = f"unknown partitioning strategy {strategy!r}; known strategies: {known}"
        raise PartitioningError(msg) from None


def partitioner_for(strategy: str, num_channels: int) -> Partitioner:
    """A new partitioner (live and replay forms) for ``strategy`` with ``num_channels`` channels.

    Rebalance starts at a random offset and shuffle is seeded from ``os.urandom``;
    construct those classes directly to fix the offset or seed.
    """
    return partitioner_class(strategy)(num_channels)


def replay_partitioner_for(strategy: str, num_channels: int) -> ReplayPartitioner:
    """The replay partitioner for ``strategy``, as ReplayPartitionerFactory did.

    Raises :class:`PartitioningError` listing the known strategies for an
    unknown name, or naming the strategy for a bad ``num_channels``.
    """
    return partitioner_for(strategy, num_channels)


def source_strategy(keyed: bool) -> str:
    """How a source's own records are routed: ``fields`` (by key) if it has a key, else ``rebalance``.

    Ingest routes live records with this strategy's live form and the FT
    service replays failures with its replay form, so a keyless source's
    replays spread over every channel round robin, as its live records do,
    and a keyed source's replays go to the channel of their key.
    """
    return "fields" if keyed else "rebalance"

"""Channel-count validation and the channel-count policy: change only a drained source.

A *channel* is one partition of a successor: a number in ``[0, n)``. Every
partitioner has a fixed ``n`` for its lifetime.

Policy when a run uses a different channel count than the persisted data was
written with: if the source still has records in flight (pending, or failed and
waiting for replay), :func:`check_channel_count` raises
:class:`~ftlayer.errors.ChannelCountMismatchError` and nothing is rescaled.
Fields routing is ``pmod(key_hash, n)``, so changing ``n`` moves almost every
key to a different channel; a replayed record would then reach a partition that
never saw its key, and a persisted forward channel may not even exist any more.
Once the source is drained there is nothing to replay, so
``PersistenceLayer.check_channels`` takes the new count over (atomically, with
the old channel streams emptied); dead letters requeued later are routed with
the new count. Keyed state is stored per key, not per channel, so it follows.

Rescaling could be added later because the key hash itself (not only the
channel) is persisted: route fields Flink-style by key group
``g = pmod(key_hash, G)`` for a fixed maximum parallelism ``G`` and give each
channel a contiguous range of groups (``channel = g * n // G``); a new ``n``
then moves whole key groups and replays recompute their channel from the hash.
Forward channels would need an explicit old-to-new channel map.
"""

from __future__ import annotations

import operator

from ftlayer.errors import ChannelCountMismatchError, PartitioningError


def validate_num_channels(num_channels: object, owner: str) -> int:
    """Return ``num_channels`` as an ``int`` if it is an integer >= 1 (not a bool).

    Raises :class:`PartitioningError` otherwise; the message starts with
    ``owner`` (e.g. ``"fields partitioner"`` or ``"source 'events'"``).
    """
    if isinstance(num_channels, bool):
        msg = f"{owner}: num_channels must be an integer >= 1, got {num_channels!r}"
        raise PartitioningError(msg)
    try:
        n = operator.index(num_channels)  # type: ignore[arg-type]
    except TypeError as exc:
        msg = f"{owner}: num_channels must be an integer >= 1, got {num_channels!r}"
        raise PartitioningError(msg) from exc
    if n < 1:
        msg = f"{owner}: num_channels must be an integer >= 1, got {n}"
        raise PartitioningError(msg)
    return n


def check_channel_count(
    recorded: int, requested: int, source: str, *, pending: int | None = None, failed: int | None = None
) -> None:
    """Fail unless this run's channel count equals the one the source was persisted with.

    ``recorded`` is the count stored with the persisted data of ``source``,
    ``requested`` the count this run is configured with; ``pending`` and
    ``failed`` (if known) the records still in flight, which block a change.
    Raises :class:`ChannelCountMismatchError` naming the source, both counts and
    the way out; see the module docstring for when a change is allowed.
    """
    if recorded != requested:
        in_flight = (
            f" and still has {pending} pending and {failed} failed records waiting for replay"
            if pending is not None and failed is not None else ""
        )
        msg = (
            f"source {source!r} was persisted with {recorded} channels but this run uses "
            f"{requested}{in_flight}; restart with num_channels={recorded}, or drain the source "
            f"first (nothing pending or waiting for replay) and then start with "
            f"num_channels={requested} and a new checkpoint"
        )
        raise ChannelCountMismatchError(msg)

"""Channel-count validation and the channel-count policy: fail clearly, never rescale.

A *channel* is one partition of a successor: a number in ``[0, n)``. Every
partitioner has a fixed ``n`` for its lifetime.

Policy when a run uses a different channel count than the persisted data was
written with: :func:`check_channel_count` raises
:class:`~ftlayer.errors.ChannelCountMismatchError` and nothing is rescaled.
Fields routing is ``pmod(key_hash, n)``, so changing ``n`` moves almost every
key to a different channel; a replayed record would then reach a partition that
never saw its key (splitting keyed state), and a persisted forward channel may
not even exist any more. Failing is the only choice that keeps "a replay goes
to the same channel as the original".

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


def check_channel_count(recorded: int, requested: int, source: str) -> None:
    """Fail unless this run's channel count equals the one the source was persisted with.

    ``recorded`` is the count stored with the persisted data of ``source``,
    ``requested`` the count this run is configured with. Raises
    :class:`ChannelCountMismatchError` naming the source and both counts; see
    the module docstring for why there is no rescaling.
    """
    if recorded != requested:
        msg = (
            f"source {source!r} was persisted with {recorded} channels but this run uses "
            f"{requested}; restart with num_channels={recorded} or drain the source first"
        )
        raise ChannelCountMismatchError(msg)

"""The channel-count policy: a mismatch fails clearly and names the way out."""

from __future__ import annotations

import pytest

from ftlayer.errors import ChannelCountMismatchError, FTLayerError, PartitioningError
from partitioners import check_channel_count


def test_same_count_passes() -> None:
    check_channel_count(4, 4, "events")


def test_mismatch_names_source_and_both_counts() -> None:
    with pytest.raises(ChannelCountMismatchError) as info:
        check_channel_count(4, 3, "events")
    assert str(info.value) == (
        "source 'events' was persisted with 4 channels but this run uses 3; "
        "restart with num_channels=4, or drain the source first (nothing pending or waiting for "
        "replay) and then start with num_channels=3 and a new checkpoint"
    )
    assert isinstance(info.value, PartitioningError)
    assert isinstance(info.value, FTLayerError)


def test_growing_is_a_mismatch_too() -> None:
    with pytest.raises(ChannelCountMismatchError, match="source 'clicks' was persisted with 2"):
        check_channel_count(2, 8, "clicks")

"""SourceRoutingPlan: several successors of one source, one persisted key hash and channel."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftlayer.errors import ChannelCountMismatchError, PartitioningError, TopologyError
from partitioners import PersistedRoute, SourceRoutingPlan, SuccessorSpec


def user_key(record: dict[str, object]) -> object:
    return record["user"]


def other_key(record: dict[str, object]) -> object:
    return record["item"]


MIXED: list[Any] = [
    ("counts", "fields", "user"),
    ("audit", "forward", None),
    ("spread", "rebalance", None),
    ("sample", "shuffle", None),
    ("total", "global", None),
    ("config", "broadcast", None),
    SuccessorSpec("sessions", "fields", "user", num_channels=7),
]


@given(h=st.integers(-(2**63), 2**63 - 1), c=st.integers(0, 3))
def test_mixed_strategies_replay_like_live(h: int, c: int) -> None:
    plan = SourceRoutingPlan("events", 4, MIXED)
    live = plan.live_channels(key_hash=h, upstream_channel=c)
    replay = plan.replay_channels(PersistedRoute(key_hash=h, channel=c))
    assert set(replay) == {"counts", "audit", "spread", "sample", "total", "config", "sessions"}
    for name in ("counts", "audit", "total", "config", "sessions"):
        assert replay[name] == live[name]
    assert replay["counts"] == [h % 4]
    assert replay["sessions"] == [h % 7]
    assert replay["audit"] == [c]
    assert replay["total"] == [0]
    assert replay["config"] == [0, 1, 2, 3]
    for name in ("spread", "sample"):
        assert len(replay[name]) == 1 and 0 <= replay[name][0] < 4


def test_plan_reports_what_is_persisted() -> None:
    plan = SourceRoutingPlan("events", 4, MIXED)
    assert plan.persists_key_hash and plan.persists_channel
    assert plan.key_selector == "user"
    assert plan.partitioner("sessions").num_channels == 7
    only_random = SourceRoutingPlan("s", 2, [("a", "shuffle", None), ("b", "global", None)])
    assert not only_random.persists_key_hash and not only_random.persists_channel
    assert only_random.key_selector is None
    assert "a:shuffle" in repr(only_random)


def test_fields_successors_sharing_a_key_name_or_function() -> None:
    SourceRoutingPlan("events", 3, [("a", "fields", "user"), ("b", "fields", "user")])
    plan = SourceRoutingPlan("events", 3, [("a", "fields", user_key), ("b", "fields", user_key)])
    assert plan.key_selector is user_key


@pytest.mark.parametrize(
    ("key_a", "key_b"),
    [("user", "item"), (user_key, other_key), ("user", user_key), (lambda r: r, lambda r: r)],
)
def test_different_key_selectors_are_a_topology_error(key_a: object, key_b: object) -> None:
    with pytest.raises(TopologyError) as info:
        SourceRoutingPlan(
            "events", 3,
            [("a", "fields", key_a), ("mid", "global", None), ("b", "fields", key_b)],  # type: ignore[list-item]
        )
    text = str(info.value)
    assert "source 'events'" in text
    assert "'a'" in text and "'b'" in text
    assert "one key hash" in text and "key_by" in text


@pytest.mark.parametrize(
    ("successors", "pattern"),
    [
        ([], "no successors"),
        ([("a", "fields", None)], "needs a key selector"),
        ([("a", "shuffle", "user")], "takes no key"),
        ([("a", "global", None), ("a", "shuffle", None)], "used by two successors"),
        ([SuccessorSpec("a", "forward", num_channels=5)], "forward needs as many channels"),
        ([("a",)], "SuccessorSpec or a tuple"),
        (["a"], "SuccessorSpec or a tuple"),
        ([("", "global", None)], "non-empty"),
    ],
)
def test_malformed_plans(successors: list[object], pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        SourceRoutingPlan("events", 4, successors)  # type: ignore[arg-type]


def test_unknown_strategy_and_bad_channel_count() -> None:
    with pytest.raises(PartitioningError, match="unknown partitioning strategy 'hash'"):
        SourceRoutingPlan("events", 4, [("a", "hash", None)])
    with pytest.raises(PartitioningError, match="source 'events': num_channels"):
        SourceRoutingPlan("events", 0, [("a", "global", None)])
    with pytest.raises(TopologyError, match="no successor 'zzz'"):
        SourceRoutingPlan("events", 4, [("a", "global", None)]).partitioner("zzz")


def test_replay_errors_name_source_and_successor() -> None:
    plan = SourceRoutingPlan("events", 4, [("audit", "forward", None)])
    with pytest.raises(PartitioningError, match="source 'events', successor 'audit': forward"):
        plan.replay_channels(PersistedRoute(1, None))
    with pytest.raises(ChannelCountMismatchError, match="successor 'audit'"):
        plan.replay_channels(PersistedRoute(1, 9))


def test_plan_pickles() -> None:
    for key in ("user", user_key):
        plan = SourceRoutingPlan("events", 4, [("a", "fields", key), ("b", "forward", None)])
        copy = pickle.loads(pickle.dumps(plan))
        rec = PersistedRoute(-123456789, 2)
        assert copy.replay_channels(rec) == plan.replay_channels(rec) == {"a": [3], "b": [2]}
        assert copy.successors == plan.successors

"""Completing-only flushes and the pending check (progressive sink acks) against a real server."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftlayer.errors import InvalidIdError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.ids import child_id, new_ids
from serialization.serializers import make_record, make_records

CHUNKED = False  # set per test by the fixture below


@pytest.fixture(autouse=True, params=["chunk per record", "one chunk"])
def _chunking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "CHUNKED", request.param == "one chunk")


def _persisted(layer: FTLayer, n: int) -> list[tuple[int, int]]:
    if CHUNKED:  # the records share a chunk, as ingest files them
        recs = make_records(layer, [{"i": i} for i in range(n)], channel=0)
    else:
        recs = [make_record(layer, {"i": i}, key=f"u{i}") for i in range(n)]
    layer.persist(recs)
    return [(r.record_id.source_record_id, r.record_id.current_record_id) for r in recs]


def test_complete_applies_only_the_deltas_that_complete(layer: FTLayer) -> None:
    (s1, r1), (s2, r2) = _persisted(layer, 2)
    a, b = child_id(r2, 1, 0), child_id(r2, 1, 1)
    layer.xor({s2: r2 ^ a ^ b})  # s2's tree is split: a and b are still open
    result = layer.complete({s1: r1, s2: a})
    assert result.acked == [s1]
    assert layer.acker.value(s1) is None
    assert layer.acker.value(s2) == a ^ b  # untouched: the partial delta was not applied
    assert layer.stats()["acked"] == 1


def test_complete_twice_changes_nothing_the_second_time(layer: FTLayer) -> None:
    (s1, r1), (s2, r2) = _persisted(layer, 2)
    a = child_id(r2, 1, 0)
    layer.xor({s2: r2 ^ a})
    assert layer.complete({s1: r1}).acked == [s1]
    again = layer.complete({s1: r1, s2: r2})  # s1 done; r2 does not complete s2 (its value is a)
    assert again.acked == [] and again.late == 1
    assert layer.acker.value(s2) == a
    assert layer.complete({s2: a}).acked == [s2]
    assert layer.pending_count() == 0 and layer.stats()["acked"] == 2


def test_complete_refuses_bad_input_whole(layer: FTLayer) -> None:
    ((s1, r1),) = _persisted(layer, 1)
    with pytest.raises(InvalidIdError):
        layer.complete({s1: r1, new_ids(1)[0]: 2**64})
    assert layer.acker.value(s1) == r1


def test_pending_of_tells_pending_from_completed_failed_and_unknown(layer: FTLayer) -> None:
    (s1, r1), (s2, _), (s3, _) = _persisted(layer, 3)
    layer.ack({s1: r1})
    layer.fail([s2])
    assert layer.pending_of([s1, s2, s3, new_ids(1)[0], s3]) == [False, False, True, False, True]
    assert layer.pending_of([]) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.integers(2, 6), order=st.permutations(range(6)), repeat=st.lists(st.integers(0, 5), max_size=4))
def test_completing_flushes_never_apply_a_partial_delta(layer: FTLayer, parts: int, order: list[int],
                                                        repeat: list[int]) -> None:
    """A tree split over ``parts`` tasks, each sending its delta completing-only (some twice) and,
    if that did not complete the record, again in its tokened end-of-task flush: the record
    completes exactly once, when the last part arrives, and no delta is ever applied twice."""
    ((sid, root),) = _persisted(layer, 1)
    children = [child_id(root, 1, i) for i in range(parts)]
    first = root
    for c in children:
        first ^= c
    layer.xor({sid: first})  # the operator: root out, every child in
    arrived = [i for i in order if i < parts]
    acked = 0
    for n, i in enumerate(arrived):
        delta = children[i]
        done = layer.complete({sid: delta}).acked
        for _ in range(repeat.count(i)):
            assert layer.complete({sid: delta}).acked == []
        if not done:
            done = layer.xor({sid: delta}, token=f"q/{sid}/t{i}").acked
            assert layer.xor({sid: delta}, token=f"q/{sid}/t{i}").applied is False
        acked += len(done)
        assert bool(done) == (n == parts - 1)
    assert acked == 1 and layer.acker.value(sid) is None

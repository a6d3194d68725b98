"""Hypothesis: random record trees complete exactly when every edge is acked, never before."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.ids import child_id
from serialization.serializers import make_record, make_records


@dataclass
class Tree:
    sid: int
    events: list[int] = field(default_factory=list)  # one XOR delta per processed record


def build_tree(sid: int, root: int, shape: list[int], depth: int) -> Tree:
    """Operators at each level anchor their input, emit children, and ack the input."""
    tree = Tree(sid)
    level = [root]
    for d in range(depth):
        nxt: list[int] = []
        for i, node in enumerate(level):
            fan = shape[(d * 7 + i) % len(shape)]
            kids = [child_id(node, d + 1, j) for j in range(fan)]
            delta = node
            for k in kids:
                delta ^= k
            tree.events.append(delta)
            nxt.extend(kids)
        level = nxt
    tree.events.extend(level)  # the sink acks every leaf
    return tree


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[list[int]], int, int, list[int], list[bool], bool]:
    shapes = draw(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=4))
    depth = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    flushes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=30))
    dups = draw(st.lists(st.booleans(), min_size=30, max_size=30))
    chunked = draw(st.booleans())  # the trees' roots share one chunk, or each has a chunk of its own
    return shapes, depth, seed, flushes, dups, chunked


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario())
def test_trees_complete_exactly_when_all_events_applied(
    make_layer: Callable[..., FTLayer], case: tuple[list[list[int]], int, int, list[int], list[bool], bool]
) -> None:
    import random

    shapes, depth, seed, flush_sizes, dups, chunked = case
    run = uuid.uuid4().hex[:12]  # examples share the namespace: fresh source and tokens
    layer = make_layer(source=f"s{run}")
    if chunked:
        records = make_records(layer, list(range(len(shapes))), channel=1)
    else:
        records = [make_record(layer, i) for i in range(len(shapes))]
    layer.persist(records)
    trees = [
        build_tree(r.record_id.source_record_id, r.record_id.current_record_id, shape, depth)
        for r, shape in zip(records, shapes, strict=True)
    ]
    events = [(t.sid, e) for t in trees for e in t.events]
    rng = random.Random(seed)
    rng.shuffle(events)
    remaining = {t.sid: len(t.events) for t in trees}
    acked: list[int] = []
    pos, n = 0, 0
    while pos < len(events):
        size = flush_sizes[n % len(flush_sizes)]
        batch = events[pos : pos + size]
        token = f"flush-{run}-{n}"
        result = layer.xor(batch, token=token)
        if dups[n % len(dups)]:
            assert not layer.xor(batch, token=token).applied  # a duplicated flush changes nothing
        for sid, _ in batch:
            remaining[sid] -= 1
        done_now = {sid for sid, left in remaining.items() if left == 0} - set(acked)
        assert set(result.acked) == done_now, "acked before all edges, or not when complete"
        acked.extend(result.acked)
        pos += size
        n += 1
    assert sorted(acked) == sorted(t.sid for t in trees)
    assert layer.pending_count() == 0

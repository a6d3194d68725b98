"""Lineage ids (ftlayer.records.lineage): stable across replays, unique among the outputs of a run.

The format and tree properties are Hypothesis tests of the pure functions; stability across
replays and a dead-letter requeue is shown on a real server (the replayer and requeue keep the
root current id). The Spark-level checks (a replay, a task retry, a flat_map's outputs) are in
tests/runtime/test_topology_faults.py and tests/runtime/test_dataframe.py.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import child_id
from ftlayer.records.lineage import LINEAGE_CHARS, lineage_hex, lineage_id, lineage_ids
from serialization.serializers import make_record

ids64 = st.integers(min_value=-(2**63), max_value=2**63 - 1).filter(bool)
# a record's tree: the paths (operator, output index, ...) from the root to each of its outputs
paths = st.lists(st.lists(st.tuples(st.integers(1, 50), st.integers(0, 20)), min_size=1, max_size=4),
                 min_size=1, max_size=30, unique_by=tuple)
_SER = SemiDeserializedSerializer()


def _output(root: int, path: list[tuple[int, int]]) -> int:
    """The current id of the output at ``path`` below ``root``, as the stages derive it."""
    cid = root
    for op, index in path:
        cid = child_id(cid, op, index)
    return cid


@given(st.lists(st.tuples(ids64, ids64), max_size=50))
def test_one_id_per_pair_in_32_hex_digits_and_the_column_form_agrees(pairs: list[tuple[int, int]]) -> None:
    origins, currents = [o for o, _ in pairs], [c for _, c in pairs]
    one_by_one = [lineage_id(o, c) for o, c in pairs]
    assert lineage_ids(origins, currents) == one_by_one
    assert lineage_hex(origins, currents) == "".join(one_by_one).encode("ascii")
    for (o, c), lid in zip(pairs, one_by_one, strict=True):
        assert len(lid) == LINEAGE_CHARS and lid == lid.lower()
        # injective: the id gives back both halves' bit patterns
        assert (int(lid[:16], 16), int(lid[16:], 16)) == (o % 2**64, c % 2**64)


@given(ids64, ids64, ids64, paths)
def test_a_replay_gives_every_output_the_same_id_and_the_outputs_of_a_record_differ(
    origin: int, root: int, other_root: int, tree: list[list[tuple[int, int]]],
) -> None:
    first = [lineage_id(origin, _output(root, p)) for p in tree]
    replay = [lineage_id(origin, _output(root, p)) for p in tree]  # new sid, same origin and root
    assert replay == first
    assert len(set(first)) == len(tree)  # one id per output
    if other_root != root:  # a later record that reuses the origin (a retired chunk id) differs
        assert set(first).isdisjoint(lineage_id(origin, _output(other_root, p)) for p in tree)


def _live(layer: FTLayer, origin: int) -> SemiDeserializedRecord:
    (rec,) = [r for r in (_SER.decode(f) for _sid, f in layer.iter_pending()) if r.origin_id == origin]
    return rec


def test_replays_and_a_requeue_keep_the_lineage_id_on_a_real_server(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=2)
    rec = make_record(layer, {"n": 1}, key="k")
    layer.persist([rec])
    origin = rec.origin_id
    seen = [(rec.record_id.source_record_id, lineage_id(origin, rec.record_id.current_record_id))]
    while layer.dead_letters.count() == 0:
        live = _live(layer, origin)
        layer.fail([live.record_id.source_record_id], "again")
        layer.replay_due()
        if layer.dead_letters.count() == 0:
            now = _live(layer, origin)
            seen.append((now.record_id.source_record_id, lineage_id(origin, now.record_id.current_record_id)))
    (entry,) = layer.dead_letters.list()
    assert layer.dead_letters.requeue([entry.entry_id], layer.num_channels).requeued == 1
    back = _live(layer, origin)
    seen.append((back.record_id.source_record_id, lineage_id(origin, back.record_id.current_record_id)))
    assert len(seen) == 4  # the first attempt, 2 replays, the requeue
    assert len({sid for sid, _ in seen}) == 4  # each attempt a new tree: late acks stay late
    assert len({lid for _, lid in seen}) == 1  # one lineage id throughout

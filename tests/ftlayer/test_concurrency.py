"""Several processes flushing into one source at once: nothing lost, nothing doubled."""

from __future__ import annotations

import multiprocessing as mp
import random
from collections.abc import Callable

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.ids import child_id
from serialization.serializers import make_record
from tests.ftlayer.conftest import commit_all


def _flush_share(cfg: FTConfig, events: list[tuple[int, int]], worker: int, out: mp.Queue[int]) -> None:
    layer = FTLayer(cfg, "topo", "conc", num_channels=4)
    rng = random.Random(worker)
    acked = 0
    pos = 0
    n = 0
    while pos < len(events):
        size = rng.randint(1, 300)
        batch = events[pos : pos + size]
        token = f"w{worker}-{n}"
        acked += len(layer.xor(batch, token=token).acked)
        layer.xor(batch, token=token)  # a client retry of the same flush
        pos += size
        n += 1
    out.put(acked)


def test_concurrent_flushes_from_four_processes(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(source="conc")
    records = [make_record(layer, i, key=i) for i in range(4000)]
    layer.persist(records)
    events: list[tuple[int, int]] = []
    for r in records:
        sid, root = r.record_id
        a, b = child_id(root, 1, 0), child_id(root, 1, 1)
        events += [(sid, root ^ a ^ b), (sid, a), (sid, b)]
    random.Random(3).shuffle(events)
    shares = [events[i::4] for i in range(4)]
    ctx = mp.get_context("fork")
    out: mp.Queue[int] = ctx.Queue()
    procs = [ctx.Process(target=_flush_share, args=(layer.config, s, i, out)) for i, s in enumerate(shares)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    total = sum(out.get(timeout=5) for _ in procs)
    assert total == 4000
    stats = layer.stats()
    assert stats["acked"] == 4000 and stats["pending"] == 0 and stats["late_deltas"] == 0
    assert stats["duplicate_flushes"] > 0
    commit_all(layer)
    assert layer.leftovers() == []

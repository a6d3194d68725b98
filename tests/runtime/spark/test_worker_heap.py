"""Frozen Python worker heaps (runtime.spark.worker_heap): when they freeze, and in real Spark tasks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from runtime.sinks import JsonLinesSink
from runtime.topology import Topology

ROOT = Path(__file__).resolve().parents[3]


def _run(code: str) -> str:
    """Run ``code`` in a fresh interpreter (freezing the test process's heap would outlive the test)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_freezes_once_then_again_only_after_imports_or_an_unfreeze() -> None:
    out = _run("""
        import gc
        from runtime.spark import worker_heap as wh
        wh.freeze_worker_heap()
        first = gc.get_freeze_count()
        wh.freeze_worker_heap(); wh.freeze_worker_heap()
        print(first > 1000, wh.freezes, wh.frozen_in_process())
        import fractions, decimal, statistics  # new modules: a new long-lived part of the heap
        wh.freeze_worker_heap()
        print(wh.freezes, gc.get_freeze_count() > first)
        wh.thaw_worker_heap()
        print(gc.get_freeze_count(), wh.frozen_in_process())
        wh.freeze_worker_heap()
        print(wh.freezes, gc.get_freeze_count() > first)
    """)
    assert out.splitlines() == ["True 1 True", "2 True", "0 False", "3 True"]


def test_a_frozen_worker_does_not_walk_its_frozen_heap_per_task() -> None:
    """Once frozen, a task's call costs no pass over the frozen objects: ``gc.get_freeze_count()``
    walks all of them (milliseconds per call, paid by every read, stage and sink task)."""
    out = _run("""
        import gc
        from runtime.spark import worker_heap as wh
        wh.freeze_worker_heap()
        def walked() -> int:
            raise AssertionError("gc.get_freeze_count() walked the frozen heap")
        gc.get_freeze_count = walked
        for _ in range(3):
            wh.freeze_worker_heap()
        print(wh.freezes)
    """)
    assert out == "1"


def test_disabled_never_freezes() -> None:
    out = _run("""
        import gc
        from runtime.spark import worker_heap as wh
        wh.freeze_worker_heap(False)
        print(gc.get_freeze_count(), wh.freezes, wh.frozen_in_process())
    """)
    assert out == "0 0 False"


def test_garbage_collected_before_the_freeze_is_not_kept() -> None:
    out = _run("""
        import gc, weakref
        from runtime.spark import worker_heap as wh
        class Node: pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle only the collector can free
        probe = weakref.ref(a)
        del a, b
        wh.freeze_worker_heap()
        gc.unfreeze(); gc.collect()
        print(probe() is None)
    """)
    assert out == "True"


def _probe(i: int) -> dict[str, int]:
    import gc

    return {"i": i, "frozen": gc.get_freeze_count()}


def _probe_at_sink(v: dict[str, int]) -> dict[str, int]:
    import gc

    return {**v, "frozen_at_sink": gc.get_freeze_count()}


@pytest.mark.spark
@pytest.mark.parametrize("status", ["on", "off"])
def test_ftlayer_tasks_run_in_frozen_workers(spark: Any, ft_config: FTConfig, tmp_path: Path, status: str) -> None:
    """The worker of every stage (the source's fused stage, the sink's) has frozen its heap by the
    time user code runs: PySpark's gc.collect() after each task then skips what is frozen."""
    out = JsonLinesSink(tmp_path / "out", with_meta=False)
    topo = Topology(f"heap{status}", ft_config.replace(status=status, timeout_s=60.0, state_dir=":temp:"))
    topo.source("nums", list(range(200))).map(_probe).key_by(lambda v: v["i"] % 7).map(_probe_at_sink).sink(out)
    query = topo.start(spark, trigger_interval_s=0.2, checkpoint_location=str(tmp_path / "ck"))
    try:
        assert query.await_drained(120)
    finally:
        query.stop()
    rows = out.read_all()
    assert sorted(r["i"] for r in rows) == list(range(200))
    assert all(r["frozen"] > 1000 and r["frozen_at_sink"] > 1000 for r in rows)

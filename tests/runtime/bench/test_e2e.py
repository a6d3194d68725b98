"""The Topology e2e benchmark at a tiny size: four variants side by side, ratios per round."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from runtime.bench.e2e import bench_e2e

pytestmark = pytest.mark.spark


def test_five_variants_side_by_side(spark: Any, redis_server_url: str) -> None:
    cfg = FTConfig(redis_url=redis_server_url, max_pending=50_000, timeout_s=120.0)
    got = bench_e2e(spark, cfg, 3000, 0, 1, warm_up=False)
    assert set(got["records_per_s"]) == {"ft-on", "ft-off", "plain", "plain-frozen", "python-frozen"}
    assert all(v["median"] > 0 for v in got["records_per_s"].values())
    for ratio in ("ft_on_vs_off_ratio", "ft_on_vs_plain_ratio", "ft_on_vs_plain_frozen_ratio",
                  "python_frozen_vs_plain_frozen_ratio", "ft_on_vs_python_frozen_ratio"):
        assert got[ratio]["median"] > 0
    # the machine's CPU per record beside each rate (Linux: /proc/stat)
    assert set(got["cpu_us_per_record"]) == set(got["records_per_s"])
    assert all(v["min"] > 0 for v in got["cpu_us_per_record"].values())


def test_as_shipped_undoes_a_frozen_worker_heap() -> None:
    """The plain baselines' tasks start with as_shipped(): PySpark's per-task gc.collect() then
    walks the whole heap again, as in a worker ftlayer never touched."""
    code = (
        "import gc\n"
        "from runtime.spark.worker_heap import freeze_worker_heap\n"
        "from runtime.bench.common import as_shipped\n"
        "freeze_worker_heap(); print(gc.get_freeze_count() > 0)\n"
        "as_shipped(); print(gc.get_freeze_count())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True", "0"]


def test_a_run_after_a_stop_that_killed_tasks_starts_on_primed_workers() -> None:
    """A plain run's stop interrupts a micro-batch (its workers are discarded): the next timed run
    comes after an untimed prime, whoever it is; runs after a quiet stop do not."""
    from runtime.bench.e2e import Run, alternate

    events: list[str] = []

    def variant(name: str, interrupts: bool) -> Any:
        def run() -> Run:
            events.append(name)
            return Run(name, 100, 1.0, interrupted=interrupts)
        return run

    variants = {"ft-on": variant("ft-on", False), "ft-off": variant("ft-off", False),
                "plain": variant("plain", True), "plain-frozen": variant("plain-frozen", True)}
    rounds, primes = alternate(variants, 2, prime=lambda: events.append("prime"), interrupted=True)
    assert events == ["prime", "ft-on", "ft-off", "plain", "prime", "plain-frozen",  # round 1
                      "prime", "ft-off", "plain", "prime", "plain-frozen", "prime", "ft-on"]  # rotated
    assert primes == 5 and [{k: run.rate for k, run in got.items()} for got in rounds] == [
        dict.fromkeys(variants, 100.0)] * 2

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


def test_four_variants_side_by_side(spark: Any, redis_server_url: str) -> None:
    cfg = FTConfig(redis_url=redis_server_url, max_pending=50_000, timeout_s=120.0)
    got = bench_e2e(spark, cfg, 3000, 0, 1, warm_up=False)
    assert set(got["records_per_s"]) == {"ft-on", "ft-off", "plain", "plain-frozen"}
    assert all(v["median"] > 0 for v in got["records_per_s"].values())
    for ratio in ("ft_on_vs_off_ratio", "ft_on_vs_plain_ratio", "ft_on_vs_plain_frozen_ratio"):
        assert got[ratio]["median"] > 0


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

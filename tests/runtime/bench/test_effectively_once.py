"""The effectively-once benchmark at a tiny size: both kinds of target, both writers, a ratio per round."""

from __future__ import annotations

from typing import Any

import pytest

from ftlayer.config import FTConfig
from runtime.bench.effectively_once import bench_effectively_once

pytestmark = pytest.mark.spark


def test_both_writers_side_by_side_into_postgres_and_delta(spark: Any, redis_server_url: str, postgres: Any) -> None:
    cfg = FTConfig(redis_url=redis_server_url, max_pending=50_000, timeout_s=120.0)
    rounds: list[tuple[str, int, dict[str, float]]] = []
    got = bench_effectively_once(spark, cfg, 2000, 1, postgres_url=postgres.url,
                                 on_round=lambda kind, r, rates: rounds.append((kind, r, rates)))
    for kind in ("postgres", "delta"):
        assert set(got[kind]["records_per_s"]) == {"at-least-once", "effectively-once"}
        assert all(v["median"] > 0 for v in got[kind]["records_per_s"].values())
        assert got[kind]["effectively_once_vs_at_least_once_ratio"]["median"] > 0
    assert [(kind, r) for kind, r, _ in rounds] == [("postgres", 0), ("delta", 0)]

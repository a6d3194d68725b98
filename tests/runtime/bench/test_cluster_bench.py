"""The cluster scaling benchmark runs end to end on real clusters (small sizes) and places its
two sources on different primaries."""

from __future__ import annotations

import pytest

from ftlayer.keyspace.shard_tags import key_slot_of, slot_ranges
from runtime.bench.cluster import TOPOLOGY, bench_cluster_scaling, spread_sources


def _owner(name: str, primaries: int) -> int:
    slot = key_slot_of(f"{{{TOPOLOGY}/{name}}}")
    return next(j for j, (lo, hi) in enumerate(slot_ranges(primaries)) if lo <= slot <= hi)


def test_the_two_sources_land_on_different_primaries() -> None:
    names = spread_sources(2, 3)
    assert len({_owner(n, 3) for n in names}) == 2


@pytest.mark.slow
def test_a_small_run_reports_both_sizes_and_a_ratio() -> None:
    got = bench_cluster_scaling(records=30_000, repeats=1, batch=3000)  # enough for /proc CPU ticks (10 ms)
    for label in ("1_primary", "3_primaries"):
        assert got["records_per_s"][label]["median"] > 0
        assert got["server_cpu_us_per_record"][label]["median"] > 0
    ratio = got["ratio"]["median"]
    assert ratio == got["records_per_s"]["3_primaries"]["median"] / got["records_per_s"]["1_primary"]["median"]

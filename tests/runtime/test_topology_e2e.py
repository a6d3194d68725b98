"""End to end on real local Spark and a real Redis: records in, each delivered, nothing left."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord
from ftlayer.records.keyhash import key_hash
from runtime.sinks import JsonLinesSink
from runtime.topology import FTQuery, Topology

pytestmark = pytest.mark.spark


def clicks(n: int) -> Any:
    for i in range(n):
        yield {"i": i, "user": f"u{i % 37}", "bot": i % 10 == 3}


def run_to_drain(query: FTQuery, timeout_s: float = 180) -> None:
    try:
        assert query.await_drained(timeout_s), query.stats()
        query.query.processAllAvailable()  # let the last commit trim the channel streams
    finally:
        query.stop()


def test_keyed_pipeline_delivers_every_record_and_leaves_nothing(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    n = 3000
    cfg = ft_config.replace(timeout_s=30.0)
    topo = Topology("e2e", cfg)
    out = JsonLinesSink(tmp_path / "out")
    (
        topo.source("clicks", clicks(n))
        .map(lambda e: {**e, "parsed": True})
        .filter(lambda e: not e["bot"])
        .key_by(lambda e: e["user"])
        .map(lambda e: {**e, "enriched": len(e["user"])})
        .sink(out)
    )
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    lines = out.read_all()
    delivered = {line["value"]["i"] for line in lines}
    assert delivered == {i for i in range(n) if i % 10 != 3}
    assert all(line["value"]["enriched"] == len(line["value"]["user"]) for line in lines)
    # keyed routing: every record of a user was processed in the partition that owns the key
    parts: dict[str, set[int]] = defaultdict(set)
    for line in lines:
        parts[line["value"]["user"]].add(line["partition"])
    for user, seen in parts.items():
        assert seen == {key_hash(user) % cfg.num_channels}, user
    layer = query.layers[0]
    stats = layer.stats()
    assert stats["persisted"] == n and stats["acked"] == n and stats["pending"] == 0
    assert layer.leftovers() == []


def test_fail_record_is_replayed_and_delivered(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    n = 1000
    cfg = ft_config.replace(timeout_s=30.0, max_replays=3)
    topo = Topology("failing", cfg)
    out = JsonLinesSink(tmp_path / "out")

    def flaky(e: dict[str, Any]) -> dict[str, Any]:
        if e["i"] % 20 == 0 and not e.get("retried"):
            raise FailRecord("first attempt")
        return e

    def poison(e: dict[str, Any]) -> dict[str, Any]:
        if e["i"] == 7:
            raise ValueError("poison")
        return e

    # a record's payload is the same on replay, so "flaky" must use state outside the record:
    seen_fail: set[int] = set()

    def flaky_once(e: dict[str, Any]) -> dict[str, Any]:
        if e["i"] % 20 == 0 and (e["i"], "x") not in seen_fail:
            import os

            marker = tmp_path / f"failed-{e['i']}"
            if not marker.exists():
                marker.write_text(str(os.getpid()))
                raise FailRecord("first attempt")
        return e

    topo.source("clicks", clicks(n), key=lambda e: e["user"]).map(flaky_once).map(poison).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    delivered = {line["value"]["i"] for line in out.read_all()}
    assert delivered == set(range(n)) - {7}
    layer = query.layers[0]
    letters = layer.dead_letters.list()
    assert len(letters) == 1 and "ValueError: poison" in letters[0].reason
    stats = layer.stats()
    assert stats["failed_explicit"] >= 50 + 4 and stats["replayed"] >= 50 + 3
    assert layer.leftovers() == []


def test_a_source_schema_dead_letters_a_misfit_at_ingest_before_any_operator(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    """``Topology.source(..., schema=...)``: a record that does not fit is dead-lettered at ingest with the
    reason naming its column; the operators never see it, nothing is replayed, and the others arrive."""
    n = 400
    topo = Topology("typed", ft_config.replace(timeout_s=30.0, max_replays=1))
    out = JsonLinesSink(tmp_path / "out")
    seen = tmp_path / "seen"
    seen.mkdir()

    def records() -> Any:
        for e in clicks(n):
            yield {**e, "i": f"#{e['i']}"} if e["i"] % 100 == 50 else e  # a string in the bigint column

    def note(e: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(e["i"], int):
            (seen / str(e["i"]).lstrip("#")).write_text("an operator saw it")
        return e

    topo.source("clicks", records(), key=lambda e: e["user"],
                schema="i bigint not null, user string, bot boolean").map(note).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    misfits = {i for i in range(n) if i % 100 == 50}
    assert {line["value"]["i"] for line in out.read_all()} == set(range(n)) - misfits
    assert list(seen.iterdir()) == []
    layer = query.layers[0]
    letters = layer.dead_letters.list()
    assert len(letters) == len(misfits)
    assert all(d.reason.startswith("ingest: does not fit the schema: column 'i' (bigint)") for d in letters)
    stats = layer.stats()
    assert stats["persisted"] == n - len(misfits) and stats["replayed"] == 0 and stats["failed_explicit"] == 0


def test_a_source_schema_that_cannot_be_read_names_the_source() -> None:
    from ftlayer.errors import TopologyError

    # Spark's parser reads it when a session exists (this module's tests have one), ftlayer's otherwise
    with pytest.raises(TopologyError, match=r"topology 't', source 'clicks': schema: cannot read the schema "
                                            r"'i lng'(?: at position 2|: \[UNSUPPORTED_DATATYPE\])"):
        Topology("t", FTConfig()).source("clicks", [], schema="i lng")

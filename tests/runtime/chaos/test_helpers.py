"""The testing helpers and the checker, on a real Redis server without Spark (fast).

These also show the checker failing: a record left pending is lost and leaked, a replay no
fault explains is reported (and fails a strict check), a dead letter without reason does not
count as handled.
"""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.checker import check
from runtime.cli.main import build_parser
from runtime.driver.ingest import Ingestor
from runtime.sinks import SinkContext
from runtime.testing import EOF, Abort, CollectingSink, Emit, FaultLog, Pause, ScriptedSource
from serialization.serializers import make_record


def test_scripted_source_plays_its_script() -> None:
    src = ScriptedSource([Emit(3), Emit(["a", {"x": 1}]), Pause(0.05), Emit(1), EOF, Emit(5)], chunk=2)
    src.open()
    got: list[Any] = []
    t0 = time.monotonic()
    while (batch := src.poll()) is not None:
        got += list(batch)
    assert time.monotonic() - t0 >= 0.05
    assert got == [{"i": 0, "user": "u0"}, {"i": 1, "user": "u1"}, {"i": 2, "user": "u2"},
                   {"i": 3, "value": "a"}, {"i": 4, "x": 1}, {"i": 5, "user": "u5"}]
    assert src.emitted_ids == range(6) and src.ended
    assert src.poll() is None  # stays ended; the Emit after EOF never plays


def test_scripted_source_counts_only_what_was_taken_and_resumes() -> None:
    src = ScriptedSource([Emit(10), EOF], chunk=10)
    batch = iter(src.poll() or [])
    assert [next(batch)["i"] for _ in range(3)] == [0, 1, 2]
    assert src.emitted == 3  # the caller stopped after three: the rest was not emitted
    src.close()
    src.open()  # a restarted topology with the same source object continues
    assert [v["i"] for v in src.poll() or []] == list(range(3, 10))
    assert src.emitted_at(5) is not None and src.emitted_at(10) is None


def test_pause_until_and_abort() -> None:
    flag: list[bool] = []
    src = ScriptedSource([Pause(30, until=lambda: bool(flag)), Abort(ValueError("boom"))])
    assert src.poll() == []
    flag.append(True)
    with pytest.raises(ValueError, match="boom"):
        src.poll()


def test_abort_stops_ingest_and_keeps_what_was_read(ft_config: FTConfig) -> None:
    layer = FTLayer(ft_config, "helpers", "events").open()
    src = ScriptedSource([Emit(10), Abort(RuntimeError("source broke")), Emit(5)])
    ing = Ingestor(layer, src)
    ing.run()
    assert isinstance(ing.error, RuntimeError) and ing.done
    assert src.emitted_ids == range(10)
    assert layer.stats()["persisted"] == 10


def _mark(directory: str, key: str) -> bool:
    return FaultLog(directory).once("f", key)


def test_fault_log_once_across_processes(tmp_path: Path) -> None:
    log = FaultLog(tmp_path)
    with multiprocessing.get_context("fork").Pool(4) as pool:
        won = pool.starmap(_mark, [(str(tmp_path), "k")] * 8)
    assert won.count(True) == 1
    log.record("f", [3, 4])
    log.record("g", [5])
    assert log.affected() == {"f": {3, 4}, "g": {5}} and log.marks("f") == 1


def _deliver(sink: CollectingSink, values: list[dict[str, Any]], replay: bool = False) -> None:
    n = len(values)
    sink.write(values, SinkContext("0", 0, 0, [1] * n, [2 if replay else 1] * n))


@pytest.fixture
def scenario(ft_config: FTConfig, tmp_path: Path) -> tuple[FTLayer, CollectingSink, list[Any]]:
    """Five persisted records: 0-2 acked, 3 dead-lettered with a reason, 4 still pending."""
    layer = FTLayer(ft_config.replace(max_replays=0), "helpers", "events").open()
    records = [make_record(layer, {"i": i}, key=i) for i in range(5)]
    layer.persist(records)
    layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in records[:3]})
    layer.fail([records[3].record_id.source_record_id], "FailRecord: bad record")
    assert layer.replay_due().dead_lettered == 1
    sink = CollectingSink(tmp_path / "out")
    _deliver(sink, [{"i": 0}, {"i": 1}, {"i": 2}])
    _deliver(sink, [{"i": 1}], replay=True)
    return layer, sink, records


def test_checker_finds_loss_and_leak(scenario: tuple[FTLayer, CollectingSink, list[Any]]) -> None:
    layer, sink, _ = scenario
    report = check([layer], sink, range(5), {"x": [1]})
    assert report.lost == [4]
    assert "events:pending=1" in report.leaked and any(k.startswith("events:pend") for k in report.leaked)
    assert report.delivered == 3 and report.lines == 4
    assert report.duplicates == 1 and report.replayed_ids == [1] and report.expected_replays == [1]
    assert report.dead_letters == [(3, "FailRecord: bad record")]
    assert not report.ok
    assert "FAILED" in report.summary() and "lost               1 [4]" in report.summary()


def test_checker_passes_when_everything_is_accounted_for(
    scenario: tuple[FTLayer, CollectingSink, list[Any]],
) -> None:
    layer, sink, records = scenario
    layer.ack({records[4].record_id.source_record_id: records[4].record_id.current_record_id})
    _deliver(sink, [{"i": 4}])
    layer.persistence.trim_done()  # what the FT service does; the Spark source trims on commit
    report = check(layer, sink, range(5), FaultLog(sink.directory + "-faults"))
    assert report.lost == [] and report.leaked == [] and report.ok
    # the replay of id 1 is explained by no fault: reported, and fatal only when strict
    assert report.unexplained_replays == [1] and report.unexplained_dead_letters == [3]
    assert not check(layer, sink, range(5), {}, strict=True).ok
    assert check(layer, sink, range(5), {"x": [1, 3]}, strict=True).ok
    report.expect("a scenario expectation", False)
    assert not report.ok and "[FAILED] a scenario expectation" in report.summary()


def test_checker_counts_phantoms(scenario: tuple[FTLayer, CollectingSink, list[Any]]) -> None:
    layer, sink, _ = scenario
    _deliver(sink, [{"i": 99}])
    report = check(layer, sink, range(5), {"x": [1]})
    assert report.phantoms == [99]


def test_chaos_cli_options_name_their_env_vars() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    chaos = sub.choices["chaos"]  # type: ignore[attr-defined]
    for action in chaos._actions:
        if action.option_strings and action.dest != "help":
            assert "[env FTLAYER_" in (action.help or ""), action.option_strings
    args = parser.parse_args(["chaos", "fail-rate", "--records", "10"])
    assert args.scenario == "fail-rate" and int(args.records) == 10


def test_checker_counts_what_the_source_produced_not_what_ingest_persisted(
    scenario: tuple[FTLayer, CollectingSink, list[Any]],
) -> None:
    """Records 5 and 6 were produced by the source (a client got them accepted, a generator yielded
    them) but ingest never persisted them: they are lost, and counted as never persisted."""
    layer, sink, records = scenario
    layer.ack({records[4].record_id.source_record_id: records[4].record_id.current_record_id})
    _deliver(sink, [{"i": 4}])
    layer.persistence.trim_done()
    assert check(layer, sink, range(5), {}).ok
    report = check(layer, sink, range(7), {})
    assert report.lost == [5, 6] and report.never_persisted == 2 and not report.ok
    assert "7 produced by the source, 5 persisted by ingest" in report.summary()


def test_checker_tells_replayed_copies_from_records_the_source_sent_again(
    scenario: tuple[FTLayer, CollectingSink, list[Any]],
) -> None:
    layer, _, _ = scenario
    lines = [
        {"origin": 10, "replay": False, "lineage": "a" * 32, "value": {"i": 0}},
        {"origin": 10, "replay": True, "lineage": "a" * 32, "value": {"i": 0}},  # a replay: same lineage id
        {"origin": 11, "replay": False, "lineage": "b" * 32, "value": {"i": 1}},
        {"origin": 12, "replay": False, "lineage": "c" * 32, "value": {"i": 1}},  # sent again: a new origin
        {"origin": 13, "replay": False, "lineage": "d" * 32, "value": {"i": 2}},
    ]
    report = check(layer, lines, range(3), {})
    assert (report.duplicates, report.extra_copies, report.lineage_duplicates, report.resent) == (2, 2, 1, 1)
    assert "1 lineage ids written twice, 1 ids re-sent by the source" in report.summary()

"""JsonLinesSink's directory: a relative one is the builder's, not each executor's working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.sinks import JsonLinesSink, SinkContext


def test_a_relative_directory_is_taken_where_the_sink_is_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sink = JsonLinesSink("clicks-out")  # as the README's tour builds it, on the driver
    elsewhere = tmp_path / "executor-work-dir"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where a local-cluster executor's Python worker runs
    sink.write([{"i": 1}], SinkContext("0", 0, 0, origins=[7], sids=[7], lineages=["ab"]))
    assert [line["value"] for line in JsonLinesSink(tmp_path / "clicks-out").read_all()] == [{"i": 1}]
    assert not (elsewhere / "clicks-out").exists()

"""``ftlayer bench``: the orchestration writes the headline keys, plots and keeps earlier figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftlayer.errors import ConfigError
from runtime.cli.main import main


def test_bench_acker_and_scaling_write_results_and_plots(
    redis_server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "results.json").write_text(json.dumps({"replay_precision": 1.0}))
    code = main(["bench", "acker", "scaling", "--redis-url", redis_server_url, "--out", str(tmp_path),
                 "--records", "2000", "--repeats", "1", "--scaling-sizes", "300,900"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    data = json.loads((tmp_path / "results.json").read_text())
    for key in ("acker_vs_raw_ratio", "bytes_per_pending_record", "scaling", "machine", "date"):
        assert key in data
    assert data["replay_precision"] == 1.0  # another benchmark's figure is kept
    assert printed["acker_vs_raw_ratio"] == data["acker_vs_raw_ratio"] > 0
    assert [p["pending"] for p in data["scaling"]["points"]] == [300, 900]
    for name in data["scaling"]["plots"]:
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_bench_refuses_unknown_names_and_bad_sizes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from runtime.cli.bench import _sizes

    with pytest.raises(ConfigError, match="scaling-sizes"):
        _sizes("10k")
    monkeypatch.setenv("FTLAYER_BENCH", "acker,warp")
    assert main(["bench", "--no-write", "--out", str(tmp_path)]) == 2


def test_scripts_bench_with_a_file_as_out_says_so_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.cli import bench

    results = tmp_path / "results.json"
    results.write_text("{}")
    assert bench.main(["acker", "--out", str(results)]) == 2  # what scripts/bench runs
    err = capsys.readouterr().err
    assert "--out" in err and "must be a directory" in err and "Traceback" not in err
    assert results.read_text() == "{}"

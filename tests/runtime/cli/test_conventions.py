"""The CLI follows the conventions of the tools operators use (issue 31 item 4), against a real server:
connection options before or after the command, ``python -m ftlayer``, ``-o json|table``, a description
on every command, help that says what the code does, no traceback on Ctrl-C or a closed pipe."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import runtime.cli.config
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.cli.main import build_parser, main
from serialization.serializers import make_record

ROOT = Path(__file__).resolve().parents[3]


def _run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out, err


def _registered(cfg: FTConfig) -> None:
    layer = FTLayer(cfg, "topo", "src", num_channels=2).open()
    layer.persist([make_record(layer, {"n": 1})])


def test_connection_options_before_or_after_the_command(
    capsys: Any, ft_config: FTConfig, redis_client: Any
) -> None:
    _registered(ft_config)
    url, ns = ft_config.redis_url, ft_config.namespace
    for argv in (
        ["--redis-url", url, "--namespace", ns, "status", "-o", "json", "--interval", "0"],   # before
        ["status", "--redis-url", url, "--namespace", ns, "-o", "json", "--interval", "0"],   # after
        ["--redis-url", url, "status", "--namespace", ns, "-o", "json", "--interval", "0"],   # mixed
        ["--namespace", "elsewhere", "--redis-url", url, "status", "--namespace", ns, "--json", "--interval", "0"],
    ):
        code, out, err = _run(capsys, *argv)
        doc = json.loads(out)
        assert code == 0 and doc["namespace"] == ns, (argv, err)  # given after the command wins
        assert [s["source"] for s in doc["sources"]] == ["src"]
    code, out, _ = _run(capsys, "--namespace", ns, "--redis-url", url, "dlq", "list")
    assert code == 0 and "no dead letters in 1 source(s)" in out
    # a command that takes no connection option says so, with its usage
    code, _, err = _run(capsys, "--namespace", ns, "redis", "--port", "1")
    assert code == 2 and err.startswith("usage: ftlayer redis") and "--namespace does not apply to ftlayer redis" in err
    # --config applies to redis (its embedded_data_dir), before or after the command: a missing file is named
    for argv in (["--config", "/nonexistent/ft.toml", "redis"], ["redis", "--config", "/nonexistent/ft.toml"]):
        code, _, err = _run(capsys, *argv)
        assert code == 2 and "/nonexistent/ft.toml" in err and "does not apply" not in err, argv
    code, _, err = _run(capsys, "redis", "--cluster", "--config", "x.toml")
    assert code == 2 and "--config cannot be used with --cluster" in err


def test_python_dash_m_ftlayer_is_the_same_command_line(redis_server_url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    got = subprocess.run([sys.executable, "-m", "ftlayer", "--version"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120, check=False)
    assert got.returncode == 0 and got.stdout.startswith("ftlayer ")
    got = subprocess.run([sys.executable, "-m", "ftlayer", "--redis-url", redis_server_url, "config", "-o", "json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["options"]["redis_url"]["origin"] == "command line"


def _commands(parser: argparse.ArgumentParser, path: str = "ftlayer") -> list[tuple[str, argparse.ArgumentParser,
                                                                                   str | None]]:
    """(path, parser, one-line help) of every command and subcommand."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((f"{path} {name}", sub, helps.get(name)))
                out += _commands(sub, f"{path} {name}")
    return out


def test_every_command_and_subcommand_has_a_description_and_a_help_line() -> None:
    commands = _commands(build_parser())
    assert {"ftlayer dlq list", "ftlayer dlq requeue", "ftlayer sources reset", "ftlayer doctor"} <= {
        c for c, _, _ in commands}
    for path, parser, line in commands:
        assert parser.description and len(parser.description) > 40, path
        assert line, path


def test_help_says_what_the_code_does(capsys: Any) -> None:
    code, out, _ = _run(capsys, "redis", "--help")
    squashed = " ".join(out.split())
    assert code == 0 and "not run on it yet" not in squashed and "point redis_url at any of them" in squashed
    code, out, _ = _run(capsys, "bench", "--help")
    squashed = " ".join(out.split())
    assert "default ./ftlayer-bench" in squashed and "[env FTLAYER_BENCH_OUT]" in squashed
    code, out, _ = _run(capsys, "ingest", "--help")
    squashed = " ".join(out.split())
    assert "2 on an error" in squashed and "1 if records read were not persisted" in squashed
    # and the code does exit 2 on an error (here: no Redis configured)
    code, _, err = _run(capsys, "ingest", "topo", "src", "-", "--redis-url", "")
    assert code == 2 and err.startswith("ftlayer: error:")


def test_top_level_help_is_short_and_lists_every_command(capsys: Any) -> None:
    code, out, _ = _run(capsys, "--help")
    assert code == 0
    assert len(out.splitlines()) < 60, out
    for command in ("status", "dlq", "sources", "doctor", "config", "ingest", "redis", "chaos", "bench"):
        assert f"    {command} " in out, command
    assert "FTLAYER_BENCH_" not in out.replace("FTLAYER_BENCH_*", "")
    assert "connection (before or after the command)" in out


def test_output_option_json_and_table(capsys: Any, ft_config: FTConfig, redis_client: Any) -> None:
    _registered(ft_config)
    conn = ["--redis-url", ft_config.redis_url, "--namespace", ft_config.namespace]
    for argv in (["status", "--interval", "0"], ["dlq", "list"], ["sources", "list"], ["config"]):
        code, table, _ = _run(capsys, *argv, *conn)
        assert code == 0 and not table.lstrip().startswith("{"), argv
        code, out, _ = _run(capsys, *argv, *conn, "-o", "json")
        assert code == 0 and isinstance(json.loads(out), dict), argv
        assert _run(capsys, *argv, *conn, "--output", "table")[1] == table or argv[0] == "status", argv
    code, _, err = _run(capsys, "status", *conn, "-o", "yaml")
    assert code == 2 and "invalid choice: 'yaml'" in err


def test_ctrl_c_and_a_closed_pipe_end_without_a_traceback(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(runtime.cli.config, "run_config", interrupted)
    code, _, err = _run(capsys, "config")
    assert code == 130 and err == "ftlayer: interrupted\n"

    def closed(_args: Any) -> int:
        raise BrokenPipeError

    monkeypatch.setattr(runtime.cli.config, "run_config", closed)
    assert _run(capsys, "config")[0] == 141


def test_a_directory_it_cannot_write_is_one_error_line(capsys: Any, tmp_path: Path, redis_server_url: str) -> None:
    (tmp_path / "file").write_text("not a directory")
    code, _, err = _run(capsys, "bench", "acker", "--redis-url", redis_server_url, "--records", "50",
                        "--repeats", "1", "--out", str(tmp_path / "file" / "sub"))
    assert code == 2 and err.startswith("ftlayer: error:") and len(err.strip().splitlines()) == 1


def test_bench_writes_into_ftlayer_bench_of_the_current_directory_by_default(
    capsys: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server_url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FTLAYER_BENCH_OUT", raising=False)
    code, _, err = _run(capsys, "bench", "acker", "--redis-url", redis_server_url, "--records", "50",
                        "--repeats", "1")
    assert code == 0
    assert (tmp_path / "ftlayer-bench" / "results.json").exists()
    assert f"results go to {tmp_path / 'ftlayer-bench' / 'results.json'}" in err

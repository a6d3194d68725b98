"""The CLI's env-var table: help generated from it, lazy conversion, and the known-name check."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import pytest

from runtime.cli.common import CLIError
from runtime.cli.env import (
    ENV_OPTIONS,
    EnvDefault,
    add_env_options,
    config_env_vars,
    known_env_vars,
    resolve_env_defaults,
    unknown_env_warnings,
)
from runtime.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[3]


def _help(capsys: Any, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_every_table_row_is_in_its_commands_help_and_only_config_variables_in_the_top_level_help(
    capsys: Any,
) -> None:
    top = _help(capsys)
    config_vars = {name for name, _ in config_env_vars()}
    for name in config_vars:
        assert name in top
    for opt in ENV_OPTIONS:
        if opt.env in config_vars:  # FTLAYER_EMBEDDED_DATA_DIR: embedded_data_dir and ftlayer redis --data-dir
            continue
        # a command's own variables belong to its help (issue 31: not ~60 bench and chaos knobs at the top)
        assert opt.env not in top, opt.env
        assert f"[env {opt.env}" in _help(capsys, opt.command), opt.env
    assert "FTLAYER_CHAOS_DUPLICATE_FLUSH" not in top and "FTLAYER_CHAOS_DUPLICATE_FLUSH" in _help(capsys, "chaos")


def test_every_ftlayer_variable_the_code_reads_is_known() -> None:
    used: set[str] = set()
    for folder in ("ftlayer", "runtime", "scripts", "tests"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh"):
                used |= set(re.findall(r"\bFTLAYER_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    used -= {"FTLAYER_TIMOUT_S", "FTLAYER_NAMESPCE", "FTLAYER_ZZZ"}  # unknown on purpose in tests
    assert used - known_env_vars() == set()


def test_unknown_names_get_a_close_match_or_a_pointer() -> None:
    env = {"FTLAYER_NAMESPCE": "x", "FTLAYER_ZZZ": "1", "FTLAYER_NAMESPACE": "ok", "OTHER_TIMOUT": "1"}
    warnings = unknown_env_warnings(env)
    assert warnings == [
        "unknown environment variable FTLAYER_NAMESPCE is ignored; did you mean FTLAYER_NAMESPACE?",
        "unknown environment variable FTLAYER_ZZZ is ignored (ftlayer --help and each command's --help name them)",
    ]


def test_defaults_are_converted_only_after_parsing_and_name_their_variable() -> None:
    parser = argparse.ArgumentParser()
    add_env_options(parser, "bench")  # building the parser reads no variable
    args = parser.parse_args(["--repeats", "7"])
    resolve_env_defaults(args, env={"FTLAYER_BENCH_RECORDS": "1_000", "FTLAYER_BENCH_NO_WRITE": "1",
                                    "FTLAYER_BENCH_REPEATS": "junk"})  # given on the command line: not read
    assert (args.records, args.repeats, args.no_write, args.e2e_repeats, args.out) == (1000, 7, True, 3,
                                                                                       "./ftlayer-bench")
    args = parser.parse_args([])
    with pytest.raises(CLIError, match=r"FTLAYER_BENCH_LATENCY_RATE='0'.*a number >= 1.*--latency-rate"):
        resolve_env_defaults(args, env={"FTLAYER_BENCH_LATENCY_RATE": "0"})


def test_build_parser_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the parser looks up none of the table's variables: every option's default is a lazy
    EnvDefault of its row, resolved only after parsing (so a bad value cannot break --help)."""
    looked_up: set[str] = set()

    class Recording(dict[str, str]):  # os.environ that notes every name looked up
        def __getitem__(self, key: str) -> str:
            looked_up.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            looked_up.add(str(key))
            return super().__contains__(key)

        def get(self, key: str, default: Any = None) -> Any:
            looked_up.add(key)
            return super().get(key, default)

    junk = {opt.env: "not a value" for opt in ENV_OPTIONS}
    monkeypatch.setattr(os, "environ", Recording({**os.environ, **junk}))
    parser = build_parser()
    assert looked_up & set(junk) == set()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for opt in ENV_OPTIONS:
        default = commands[opt.command].get_default(opt.dest)
        assert isinstance(default, EnvDefault) and default.option is opt, opt.env


def test_a_flag_variable_takes_the_usual_spellings_and_refuses_any_other_value() -> None:
    """FTLAYER_CHAOS_STRICT=true is on (not silently off), =maybe is refused naming the variable."""
    parser = argparse.ArgumentParser()
    add_env_options(parser, "chaos")
    for raw, on in [("1", True), ("true", True), ("YES", True), (" on ", True),
                    ("0", False), ("false", False), ("No", False), ("off", False), ("", False)]:
        args = resolve_env_defaults(parser.parse_args([]), env={"FTLAYER_CHAOS_STRICT": raw})
        assert args.strict is on, raw
    assert resolve_env_defaults(parser.parse_args([]), env={}).strict is False
    assert resolve_env_defaults(parser.parse_args(["--strict"]), env={"FTLAYER_CHAOS_STRICT": "junk"}).strict
    with pytest.raises(CLIError, match=r"FTLAYER_CHAOS_STRICT='maybe' is invalid.*ftlayer chaos --strict"):
        resolve_env_defaults(parser.parse_args([]), env={"FTLAYER_CHAOS_STRICT": "maybe"})


def test_a_bad_flag_variable_is_one_error_line_and_exit_2(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, redis_server_url: str, tmp_path: Path
) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"i": 1}\n')
    monkeypatch.setenv("FTLAYER_INGEST_FROM_START", "maybe")
    code = main(["ingest", "envflag", "events", str(lines), "--redis-url", redis_server_url,
                 "--namespace", "envflag", "--offsets-dir", str(tmp_path / "offsets")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("ftlayer: error: environment variable FTLAYER_INGEST_FROM_START='maybe' is invalid")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err

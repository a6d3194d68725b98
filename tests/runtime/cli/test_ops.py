"""The CLI without surprises (issue 15): every defect found by trying it as a new user, each with a test.

Commands run in-process through ``runtime.cli.main`` (or as a subprocess where signals or a fresh
environment matter) against a real server; no output may hold a Python traceback.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from ftlayer.servers.embedded import EmbeddedServer
from runtime.cli.main import main

ROOT = Path(__file__).resolve().parents[3]


def _run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    """main(argv) in-process: (exit code, stdout, stderr); argparse's SystemExit counts as an exit code."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out, err


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def test_bad_bench_env_value_breaks_neither_help_nor_other_commands(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, redis_server_url: str, namespace: str
) -> None:
    monkeypatch.setenv("FTLAYER_BENCH_RECORDS", "abc")
    assert _run(capsys, "--help")[0] == 0
    assert _run(capsys, "bench", "--help")[0] == 0
    assert _run(capsys, "status", "--redis-url", redis_server_url, "--namespace", namespace, "--interval", "0")[0] == 0
    code, _, err = _run(capsys, "bench", "--no-write", "acker")
    assert code == 2
    assert "FTLAYER_BENCH_RECORDS='abc'" in err and "expected an integer" in err and "--records" in err


def test_db_index_out_of_range_is_one_clear_line(capsys: Any, redis_server_url: str) -> None:
    code, _, err = _run(capsys, "status", "--redis-url", _with_db(redis_server_url, 99), "--interval", "0")
    assert code == 2
    assert err.startswith("ftlayer: error:") and "no database 99" in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_missing_password_is_explained_not_the_servers_hello_text(capsys: Any) -> None:
    with EmbeddedServer(password="s3cret-pw") as server:
        bare = server.url.replace(":s3cret-pw@", "")
        code, _, err = _run(capsys, "status", "--redis-url", bare, "--interval", "0")
        assert code == 2
        assert "requires a password and the URL has none" in err
        assert "HELLO" not in err and "s3cret-pw" not in err
        code, _, err = _run(capsys, "status", "--redis-url", server.url.replace("s3cret-pw", "wrong-pw"),
                            "--interval", "0")
        assert code == 2 and "wrong user or password" in err and "wrong-pw" not in err


def test_a_url_without_password_is_shown_one_with_password_is_masked(capsys: Any) -> None:
    code, _, err = _run(capsys, "status", "--redis-url", "localhost:6379", "--interval", "0")
    assert code == 2 and "'localhost:6379'" in err
    code, _, err = _run(capsys, "status", "--redis-url", "ftuser:hunter2@localhost:6379", "--interval", "0")
    assert code == 2 and "hunter2" not in err and "localhost:6379" in err


def _redis_foreground(env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[str], str, Path]:
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli.main", "redis", *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url = re.search(r"(redis://\S+)", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
    data_dir = Path(re.search(r"data dir (\S+)", proc.stdout.readline()).group(1))  # type: ignore[union-attr]
    return proc, url, data_dir


@pytest.mark.slow
def test_ftlayer_redis_honours_the_data_dir_env_and_sigterm_removes_its_temp_dir(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    env.pop("FTLAYER_EMBEDDED_DATA_DIR", None)
    given = tmp_path / "kept"
    proc, _, data_dir = _redis_foreground({**env, "FTLAYER_EMBEDDED_DATA_DIR": str(given)})
    assert data_dir == given.resolve() and (given / "valkey.log").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert given.exists()  # a given directory is kept (its AOF is the point)

    # the config file's embedded_data_dir, named with --config before or after the command
    from_file = tmp_path / "from-file"
    config = tmp_path / "ft.toml"
    config.write_text(f'[ftlayer]\nembedded_data_dir = "{from_file}"\n')
    proc, _, data_dir = _redis_foreground(env, "--config", str(config))
    assert data_dir == from_file.resolve()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0

    proc, _, data_dir = _redis_foreground(env)
    assert data_dir.parent == (tmp_path / "tmp").resolve() and data_dir.exists()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    _, err = proc.communicate()
    assert code == 0 and "Traceback" not in err
    assert not data_dir.exists()  # the temporary one is removed, as on Ctrl-C


def test_misspelled_ftlayer_variable_warns_with_did_you_mean(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, redis_server_url: str, namespace: str
) -> None:
    monkeypatch.setenv("FTLAYER_TIMOUT_S", "5")
    code, _, err = _run(capsys, "status", "--redis-url", redis_server_url, "--namespace", namespace, "--interval", "0")
    assert code == 0
    assert "FTLAYER_TIMOUT_S" in err and "did you mean FTLAYER_TIMEOUT_S?" in err


def test_bad_option_prints_the_subcommands_usage(capsys: Any) -> None:
    code, _, err = _run(capsys, "status", "--bogus")
    assert code == 2
    assert err.startswith("usage: ftlayer status") and "ftlayer status: error: unrecognized arguments: --bogus" in err
    code, _, err = _run(capsys, "dlq", "list", "--bogus")
    assert code == 2 and err.startswith("usage: ftlayer dlq list")


def test_messages_show_no_internal_names_nor_a_int(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = _run(capsys, "dlq")
    assert code == 2 and "dlq_command" not in err and "{list,show,requeue,purge}" in err
    monkeypatch.setenv("FTLAYER_NUM_BUCKETS", "four")
    code, _, err = _run(capsys, "status", "--redis-url", "redis://127.0.0.1:1/0", "--interval", "0")
    assert code == 2 and "a int" not in err and "expected an integer" in err


def test_range_errors_name_the_env_var_the_value_came_from(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FTLAYER_TIMEOUT_S", "-1")
    code, _, err = _run(capsys, "status", "--redis-url", "redis://127.0.0.1:1/0", "--interval", "0")
    assert code == 2 and "timeout_s=-1.0 (from env FTLAYER_TIMEOUT_S)" in err


def test_dlq_requeue_without_ids_reports_usage_before_connecting(capsys: Any) -> None:
    # nothing listens on port 1: a usage error must come first, not a connection error
    code, _, err = _run(capsys, "dlq", "requeue", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2 and "give either ENTRY_ID... or --all" in err and "reach" not in err
    code, _, err = _run(capsys, "dlq", "purge", "not-an-id", "--redis-url", "redis://127.0.0.1:1/0")
    assert code == 2 and "invalid dead-letter entry id 'not-an-id'" in err


def test_chaos_help_states_its_namespace_default_and_bench_help_is_plain(capsys: Any) -> None:
    code, out, _ = _run(capsys, "chaos", "--help")
    assert code == 0
    squashed = " ".join(out.split())
    assert "default 'ftlayer'" not in squashed and "default a fresh 'chaos<8 hex digits>' namespace" in squashed
    code, out, _ = _run(capsys, "bench", "--help")
    assert code == 0 and "``" not in out and ":mod:" not in out


def test_version(capsys: Any) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0 and re.fullmatch(r"ftlayer \d+\.\d+\.\d+\S*\n", out)


def test_config_prints_the_effective_config_and_each_origin(
    capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "ftlayer.toml").write_text("[ftlayer]\nmax_replays = 9\ntimeout_s = 12\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FTLAYER_CONFIG", raising=False)
    monkeypatch.setenv("FTLAYER_NUM_BUCKETS", "4")
    monkeypatch.setenv("FTLAYER_TIMEOUT_S", "20")
    code, out, _ = _run(capsys, "config", "--json", "--conf", "spark.ftlayer.timeout_s=61", "--namespace", "cli",
                        "--redis-url", "redis://u:topsecret@db.internal:6379/2")
    assert code == 0 and "topsecret" not in out
    doc = json.loads(out)["options"]
    assert doc["max_replays"] == {"value": 9, "origin": "file ftlayer.toml"}
    assert doc["num_buckets"] == {"value": 4, "origin": "env FTLAYER_NUM_BUCKETS"}
    assert doc["timeout_s"] == {"value": 61.0, "origin": "Spark conf spark.ftlayer.timeout_s"}
    assert doc["namespace"] == {"value": "cli", "origin": "command line"}
    assert doc["redis_url"] == {"value": "redis://u:***@db.internal:6379/2", "origin": "command line"}
    assert doc["durability"] == {"value": "everysec", "origin": "default"}
    code, out, _ = _run(capsys, "config")
    assert code == 0 and re.search(r"^timeout_s\s+20\.0\s+env FTLAYER_TIMEOUT_S$", out, re.M)
    code, _, err = _run(capsys, "config", "--conf", "spark.ftlayer.num_buckets=1")
    assert code == 2 and "(from Spark conf spark.ftlayer.num_buckets)" in err

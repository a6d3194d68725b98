"""``ftlayer status`` / ``dlq`` / ``sources`` with no Redis URL, beside a topology run here that has ended:
its state (``<state_dir>/<topology>/redis/``) is served for the command, then stopped; a running one is not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.servers.state_dir import TopologyState
from runtime.cli.main import main
from runtime.cli.stopped_state import _holder

ROOT = Path(__file__).resolve().parents[3]

# a program run with the defaults (no redis_url): 20 records persisted, one dead-lettered by ingest
PROGRAM = textwrap.dedent("""
    import sys
    from ftlayer.config import FTConfig
    from ftlayer.facade.ft_layer import FTLayer
    from ftlayer.servers.state_dir import TopologyState
    from runtime.driver.ingest import Ingestor

    topology = sys.argv[1]
    config = FTConfig.load()  # the defaults and FTLAYER_* (FTLAYER_STATE_DIR), as a program's config
    state = TopologyState.open(config, topology)
    server = state.embedded_server(config)
    layer = FTLayer(FTConfig(redis_url=server.url), topology, "events", num_channels=2).open()
    records = [{"user": f"u{i}", "i": i} for i in range(20)] + [{"i": 20}]
    Ingestor(layer, records, key=lambda r: r["user"]).run()
    print(server.url, server.pid, flush=True)
""")


def _run_program(tmp_path: Path, topology: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROGRAM, topology], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, check=True, env={**_clean_env(), "PYTHONPATH": str(ROOT)}).stdout.split()
    return out[0], int(out[1])


def _clean_env() -> dict[str, str]:
    names = ("FTLAYER_REDIS_URL", "FTLAYER_STATE_DIR", "FTLAYER_EMBEDDED_DATA_DIR", "FTLAYER_CONFIG")
    return {k: v for k, v in os.environ.items() if k not in names}


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("FTLAYER_REDIS_URL", "FTLAYER_STATE_DIR", "FTLAYER_EMBEDDED_DATA_DIR", "FTLAYER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_ended_topology_is_read_from_its_state_and_its_server_stops_after(here: Path, capsys: Any) -> None:
    _, first_pid = _run_program(here, "tour")
    assert _gone(first_pid)  # the program's server stopped with it
    assert main(["dlq", "list"]) == 0
    out, err = capsys.readouterr()
    assert "topology 'tour' is not running; serving its state" in err, err
    assert "key selector raised: KeyError" in out, out
    assert main(["status", "--json"]) == 0
    out, _ = capsys.readouterr()
    assert '"persisted": 20' in out and '"dead_lettered": 1' in out, out
    lock = here / ".ftlayer" / "tour" / "lock"
    assert _holder(lock) is None  # released once the command ended
    pid_file = here / ".ftlayer" / "tour" / "redis" / "server.pid"
    assert not pid_file.exists()  # the command's server stopped (gracefully: it removes its pid file)
    # what a command changes is in the AOF for the next run: purge, then a fresh read shows none
    assert main(["dlq", "purge", "--all", "--yes"]) == 0
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    assert '"dead_letters": 0' in capsys.readouterr().out


def test_with_two_ended_topologies_topology_picks_one(here: Path, capsys: Any) -> None:
    _run_program(here, "tour")
    _run_program(here, "other")
    assert main(["dlq", "list"]) == 2  # which one?
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "topologies other, tour under .ftlayer are not running: pick one with " \
        "--topology" in err, err
    assert main(["dlq", "list", "--topology", "other"]) == 0
    out, err = capsys.readouterr()
    assert "topology 'other' is not running" in err and "KeyError" in out
    # sources describe and reset name the topology as an argument
    assert main(["sources", "describe", "other", "events"]) == 0
    assert "topology 'other' is not running" in capsys.readouterr().err
    assert main(["dlq", "list", "--topology", "third"]) == 2
    assert "no state of topology 'third' under .ftlayer" in capsys.readouterr().err


def test_a_state_dir_with_a_tilde_is_found_as_the_program_finds_it(
        here: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(here))
    monkeypatch.setenv("FTLAYER_STATE_DIR", "~/ftstate")
    subprocess.run([sys.executable, "-c", PROGRAM, "tour"], cwd=here, capture_output=True, text=True, timeout=120,
                   check=True, env={**_clean_env(), "PYTHONPATH": str(ROOT), "HOME": str(here),
                                    "FTLAYER_STATE_DIR": "~/ftstate"})
    assert (here / "ftstate" / "tour" / "redis" / "appendonlydir").is_dir()
    assert main(["dlq", "list"]) == 0
    assert "KeyError" in capsys.readouterr().out


def test_a_running_topology_keeps_its_own_server_and_the_error_says_where(here: Path, capsys: Any) -> None:
    _run_program(here, "tour")
    _run_program(here, "older")
    state = TopologyState.open(FTConfig(), "tour")  # running again (this process holds its lock)
    try:
        server = state.embedded_server(FTConfig())
        # the ended "older" is not shown instead of the running "tour"
        for argv in (["dlq", "list"], ["status"], ["dlq", "list", "--topology", "tour"]):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert f"topology 'tour' is running (process {os.getpid()} holds .ftlayer/tour; its server: " \
                f"{server.url}): pass its URL with --redis-url" in err and "serving its state" not in err, err
        assert main(["dlq", "list", "--redis-url", server.url]) == 0
        assert "KeyError" in capsys.readouterr().out
    finally:
        state.close()


def test_a_damaged_state_is_one_error_line_and_the_lock_is_released(here: Path, capsys: Any) -> None:
    _run_program(here, "tour")
    aof = here / ".ftlayer" / "tour" / "redis" / "appendonlydir"
    for part in aof.glob("*.incr.aof"):
        part.write_bytes(part.read_bytes() + b"*3\r\n$3\r\nSET\r\n$1\r\nk")  # a command cut short mid-file
    manifest = next(aof.glob("*.manifest"))
    manifest.write_text(manifest.read_text() + "garbage line\n")
    assert main(["dlq", "list"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "the state of topology 'tour'" in err and "could not be served" in err and "valkey.log" in err, err
    assert _holder(here / ".ftlayer" / "tour" / "lock") is None

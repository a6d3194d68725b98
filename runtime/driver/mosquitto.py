"""A private Mosquitto broker for tests, chaos scenarios and demos, from the distribution's binary.

``EmbeddedMosquitto`` writes a ``mosquitto.conf`` into its directory and runs ``mosquitto -c``
on a free port of 127.0.0.1. It is the real broker, not a mock: **persistence is on** (its
database ``mosquitto.db`` in the directory, saved after every ``autosave_changes`` changes,
default 1: each message queued or acknowledged), so a :meth:`kill9` and :meth:`restart` on the
same directory bring back the sessions, subscriptions and queued messages saved before the kill.

Contract:

- ``start()`` returns only when the broker accepts TCP connections on its port (polled), or
  raises :class:`MosquittoError` with the tail of its log.
- The binary comes from PATH, else ``/usr/sbin/mosquitto`` (Debian's place, off a normal
  user's PATH); none found raises :class:`MosquittoError` saying what to install.
- ``users={"name": "password"}`` turns anonymous access off and writes a password file with
  ``mosquitto_passwd``; ``tls=(certfile, keyfile)`` makes the listener TLS-only.
- Mosquitto drops privileges to user ``mosquitto`` when started as root, which could then not
  write a directory made by root: as root the configuration says ``user root`` (it logs a
  warning and stays root).
- ``max_queued_messages`` is 0 (no limit): the default of 1000 would drop QoS 1 messages queued
  for a session while its ingest is down, which no client could prevent.
- The log (``log_type all`` unless ``verbose=False``: every PUBLISH sent and PUBACK received,
  with its packet id) is ``mosquitto.log`` in the directory, written line by line (through
  ``stdbuf -oL`` when coreutils has it); :meth:`log_lines` reads it.
- A temporary directory (the default) is removed by ``stop()``; a given one is kept.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from ftlayer.errors import FTLayerError
from ftlayer.servers.ports import PORT_DRAWS, PORT_TAKEN, free_port, listens_on, start_redrawing

__all__ = ["INSTALL_HINT", "EmbeddedMosquitto", "MosquittoError", "find_mosquitto"]

INSTALL_HINT = "install the Mosquitto broker (Debian/Ubuntu: apt-get install mosquitto)"


class MosquittoError(FTLayerError, RuntimeError):
    """The Mosquitto broker could not be found, configured, started or stopped."""


def find_mosquitto() -> Path:
    """The ``mosquitto`` binary (PATH, then /usr/sbin and /usr/local/sbin)."""
    on_path = shutil.which("mosquitto")
    candidates = [Path(on_path)] if on_path else []
    candidates += [Path("/usr/sbin/mosquitto"), Path("/usr/local/sbin/mosquitto")]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    msg = f"no 'mosquitto' binary on PATH or in /usr/sbin: {INSTALL_HINT}"
    raise MosquittoError(msg)


class EmbeddedMosquitto:
    """One Mosquitto broker on 127.0.0.1; see the module notes for the contract."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        port: int | None = None,
        users: dict[str, str] | None = None,
        tls: tuple[str, str] | None = None,
        autosave_changes: int = 1,
        verbose: bool = True,
    ) -> None:
        self._bin = find_mosquitto()
        self._temporary = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="ftlayer-mqtt-") if directory is None else directory)
        self._port_drawn, self._started_once = port is None, False
        self.port = port or free_port()
        self.users = dict(users or {})
        self.tls = tls
        self.autosave_changes = autosave_changes
        self.verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        atexit.register(self._kill_quietly)

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:<port>`` (``mqtts://`` with TLS); no credentials in it."""
        return f"{'mqtts' if self.tls else 'mqtt'}://127.0.0.1:{self.port}"

    def url_for(self, user: str) -> str:
        """The URL with ``user`` and its password in it."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}:{self.users[user]}@127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "mosquitto.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _config(self) -> str:
        lines = [
            f"listener {self.port} 127.0.0.1",
            f"allow_anonymous {'false' if self.users else 'true'}",
            "persistence true",
            f"persistence_location {self.directory}/",
            "autosave_on_changes true",
            f"autosave_interval {self.autosave_changes}",
            "max_queued_messages 0",
            "log_dest stdout",  # to mosquitto.log, line-buffered (see start): a file dest is flushed only now and then
            "log_timestamp_format %Y-%m-%dT%H:%M:%S",
        ]
        lines += ["log_type all"] if self.verbose else ["log_type error", "log_type warning", "log_type notice"]
        if self.users:
            lines.append(f"password_file {self.directory / 'passwords'}")
        if self.tls:
            lines += [f"certfile {self.tls[0]}", f"keyfile {self.tls[1]}"]
        if os.geteuid() == 0:
            lines.append("user root")
        return "\n".join(lines) + "\n"

    def _write_passwords(self) -> None:
        tool = shutil.which("mosquitto_passwd") or str(self._bin.parent.parent / "bin" / "mosquitto_passwd")
        path = self.directory / "passwords"
        path.write_text("")
        for user, password in self.users.items():
            done = subprocess.run([tool, "-b", str(path), user, password], capture_output=True, check=False)
            if done.returncode != 0:
                msg = f"mosquitto_passwd failed for user {user!r}: {done.stderr.decode(errors='replace')[-500:]}"
                raise MosquittoError(msg)
        path.chmod(0o600)

    def start(self, timeout_s: float = 30.0) -> EmbeddedMosquitto:
        """Write the configuration, start the broker and wait until it accepts connections.

        A drawn port (no ``port`` given) was free only when drawn: if another process binds it
        first, the broker exits ("Address already in use") and a first start draws a new port and
        starts again, up to 5 times (``port`` then names it). A given port, and a restart, keep theirs.
        """
        if self.pid is not None:
            return self
        start_redrawing(lambda: self._start_once(timeout_s), self._redraw,
                        lambda exc: isinstance(exc, MosquittoError) and PORT_TAKEN in str(exc),
                        draws=PORT_DRAWS if self._port_drawn and not self._started_once else 1)
        self._started_once = True
        return self

    def _redraw(self) -> None:
        self.port = free_port()

    def _start_once(self, timeout_s: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.users:
            self._write_passwords()
        conf = self.directory / "mosquitto.conf"
        conf.write_text(self._config())
        # stdbuf -oL: one line at a time, so a test reads the PUBLISH and PUBACK lines as they happen
        stdbuf = shutil.which("stdbuf")
        args = ([stdbuf, "-oL"] if stdbuf else []) + [str(self._bin), "-c", str(conf)]
        with self.log_path.open("ab") as out:
            self._proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                msg = f"mosquitto exited with {self._proc.returncode} on port {self.port}:\n{self.log_tail()}"
                self._proc = None
                raise MosquittoError(msg)
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                if listens_on(self._proc.pid, self.port):  # ours, not a process that bound the port first
                    return
            if time.monotonic() > deadline:
                self._kill_quietly()
                msg = f"mosquitto did not listen on port {self.port} within {timeout_s}s:\n{self.log_tail()}"
                raise MosquittoError(msg)
            time.sleep(0.02)

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_lines()[-lines:]) or "(no log)"

    def freeze(self) -> None:
        """SIGSTOP the broker (it answers nothing until :meth:`thaw`)."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def kill9(self) -> None:
        """SIGKILL the broker (a crash: what was not saved to ``mosquitto.db`` is gone); :meth:`restart` recovers."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def restart(self, timeout_s: float = 30.0) -> EmbeddedMosquitto:
        """Start again on the same port and directory (after :meth:`kill9` or :meth:`stop`)."""
        return self.start(timeout_s)

    def stop(self, timeout_s: float = 10.0, *, remove: bool = True) -> None:
        """SIGTERM (the broker saves its database), SIGKILL after ``timeout_s``; removes a temporary
        directory unless ``remove`` is False."""
        if self._proc is not None:
            self.thaw()
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
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

    def __enter__(self) -> EmbeddedMosquitto:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

"""The webhook receiver split in two processes: the link between ingest's process and the HTTP front.

Why: under load each half of the receiver takes about a core. The HTTP half (connections, llhttp,
aiohttp's request and response objects) cost about 210 us a 100-record request on this machine's
2-core VM, and the ingest half (JSON, msgpack, key hashes, chunk encoding, the persist's round
trip) about as much. In one process the two share one GIL, so the receiver could never use more
than one core: 0.29-0.35 of the raw server's rate, with CPU to spare. In two processes each half
has a core's worth of its own, and the front parses the JSON too (it has CPU to spare; the ingest
process is the one that runs out). The link costs a few microseconds a request: msgpack frames
over a Unix socket pair, many per system call.

Frames (msgpack arrays, back to back on the stream; ``rid`` numbers a request or a question):

- front -> ingest: ``("up",)`` once it serves (``("error", why)`` and its exit if it cannot);
  ``("offer", rid, records)`` a records request that passed every check, its records as one
  msgpack array (``("offer-body", rid, body, content_type, batch)`` when msgpack cannot carry one
  of them: parsed again here); ``("withdraw", rid)`` its answer gave up waiting; ``("answered",
  [[status, records], ...])`` what it answered since the last one (the source's counters);
  ``("ready?", rid)`` and ``("health?", rid)``.
- ingest -> front: ``("config", {...})`` first; ``("ok", [[rid, records], ...])`` persisted (200);
  ``("fail", [rid, ...])`` abandoned (503); ``("answer", rid, status, why, records)`` a request
  refused (503 from admission; 400 from a body parsed here) or empty (200, 0 records); ``("reply", rid,
  value)`` to a question; ``("stop",)``.

Contract: every guarantee of :mod:`runtime.driver.webhook` holds as in one process, because every
decision about a request's records is still the source's (admission, what persisted): the front
checks requests as the one-process receiver does (the same functions) and carries answers. A
front that dies (killed) closes its connections, so their clients retry, and the source starts a
new one on the same port (a few times a minute at most; past that it fails its poll with
:class:`WebhookError` once the records it holds are handed over, so ingest stops with the reason
instead of waiting on a port nobody serves). An ingest process that dies (even SIGKILL) closes
the link, and the front exits at once, closing the port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import msgpack

from ftlayer.logs import logger_for
from runtime.driver.ready_probe import ReadyProbe
from runtime.driver.webhook_body import WebhookError

log = logger_for(__name__)

START_TIMEOUT_S = 60.0  # the front's start (an interpreter, aiohttp's import): seconds before giving up
STOP_TIMEOUT_S = 30.0  # stop(): how long the front may take to close its connections before SIGKILL
RECV_BYTES = 1 << 18


class LinkedSource(Protocol):
    """What the link needs of :class:`~runtime.driver.webhook.WebhookSource`."""

    def take(self, link: FrontLink, rid: int, values: list[Any]) -> None: ...
    def take_body(self, link: FrontLink, rid: int, body: bytes, content_type: str | None, batch: bool) -> None: ...
    def withdraw_request(self, link: FrontLink, rid: int) -> None: ...
    def wake(self) -> None: ...
    def answered(self, status: int, records: int) -> None: ...
    def readiness(self) -> str | None: ...
    def health(self) -> dict[str, Any]: ...
    def front_lost(self, link: FrontLink, why: str) -> None: ...


def _front_env() -> dict[str, str]:
    """The parent's environment, with this checkout first on PYTHONPATH (so an uninstalled checkout
    runs the same code in both processes)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


class FrontLink:
    """A running front process (:mod:`runtime.driver.webhook_front`) serving ``listener`` for ``source``.

    The constructor returns once the front serves (WebhookError naming its exit code if it does not
    start); the caller may close its copy of ``listener`` then, and calls :meth:`start` once it is
    ready for the front's requests. Thread-safe :meth:`send`.
    """

    def __init__(self, source: LinkedSource, listener: socket.socket, config: dict[str, Any], *,
                 ready_check: Any = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.source = source
        self.probe = ReadyProbe(ready_check)
        self._send_lock = threading.Lock()
        self._stopping = False
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=0)
        self._early: list[Sequence[Any]] = []  # frames that came before "up"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "runtime.driver.webhook_front", str(theirs.fileno()), str(listener.fileno())],
                pass_fds=(theirs.fileno(), listener.fileno()), env=_front_env(), stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock = ours
        try:
            self.send(("config", config))
            self._await_up(start_timeout_s)
        except BaseException:
            self._kill()
            raise
        self._reader = threading.Thread(target=self._read, name="ftlayer-webhook-link", daemon=True)

    def start(self) -> None:
        """Take the front's frames from now on (once the source holds this link)."""
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _await_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        error: str | None = None
        self._sock.settimeout(0.2)
        try:
            while True:
                try:
                    data = self._sock.recv(RECV_BYTES)
                except TimeoutError:
                    data = None
                except OSError:  # ECONNRESET: it died with our config frame unread
                    data = b""
                if data:
                    self._unpacker.feed(data)
                    for frame in self._unpacker:
                        if frame[0] == "up":
                            return
                        if frame[0] == "error":  # it could not start, and says why (then exits)
                            error = frame[1]
                        else:
                            self._early.append(frame)
                # ended: the link's end of file (after anything it said), or nothing to read and no process
                if data == b"" or (data is None and self._proc.poll() is not None):
                    code = self._proc.wait(5)
                    why = f": {error}" if error else " (its error, if any, is above)"
                    msg = f"the webhook's HTTP process (pid {self._proc.pid}) exited with code {code} before serving"
                    raise WebhookError(msg + why)
                if time.monotonic() > deadline:
                    msg = f"the webhook's HTTP process did not start within {timeout_s:g} s"
                    raise WebhookError(msg)
        finally:
            self._sock.settimeout(None)

    # --- to the front ---------------------------------------------------------------------------------
    def send(self, frame: tuple[Any, ...]) -> None:
        """Send one frame; dropped (logged) once the front is gone: its connections closed with it."""
        data = msgpack.packb(frame)
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                log.debug("webhook: frame %r not sent, the front is gone (%s)", frame[0], exc)

    def settle(self, tickets: Sequence[Any], ok: bool) -> None:
        """Answer requests taken (``ticket.rid``, ``ticket.values``): 200 if ``ok``, else 503."""
        if ok:
            self.send(("ok", [[t.rid, len(t.values)] for t in tickets]))
        else:
            self.send(("fail", [t.rid for t in tickets]))

    def answer(self, rid: int, status: int, why: str | None, records: int) -> None:
        self.send(("answer", rid, status, why, records))

    # --- from the front -------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            self._dispatch(self._early)
            self._early = []
            while True:
                try:
                    data = self._sock.recv(RECV_BYTES)
                except OSError:
                    data = b""
                if not data:
                    break
                self._unpacker.feed(data)
                self._dispatch(self._unpacker)
        except Exception:
            log.exception("webhook: the link to the HTTP process failed")
        if not self._stopping:
            code = self._proc.wait()
            self.source.front_lost(self, f"the webhook's HTTP process (pid {self._proc.pid}) exited with code {code}")

    def _dispatch(self, frames: Any) -> None:
        """Apply the frames of one read; ingest is woken once for all the requests among them."""
        source, offered = self.source, False
        for frame in frames:
            kind = frame[0]
            if kind == "offer":
                source.take(self, frame[1], msgpack.unpackb(frame[2], raw=False, strict_map_key=False))
                offered = True
            elif kind == "offer-body":
                source.take_body(self, frame[1], frame[2], frame[3], frame[4])
                offered = True
            elif kind == "answered":
                for status, records in frame[1]:
                    source.answered(status, records)
            elif kind == "withdraw":
                source.withdraw_request(self, frame[1])
            elif kind == "health?":
                self.send(("reply", frame[1], source.health()))
            elif kind == "ready?":  # the check may take seconds: never on this thread
                threading.Thread(target=self._ready, args=(frame[1],), name="ftlayer-webhook-ready",
                                 daemon=True).start()
        if offered:
            source.wake()

    def _ready(self, rid: int) -> None:
        self.send(("reply", rid, self.source.readiness() or self.probe.check()))

    # --- the end --------------------------------------------------------------------------------------
    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Tell the front to close its port and connections; wait for it (SIGKILL after ``timeout_s``)."""
        self._stopping = True
        self.send(("stop",))
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("webhook: the HTTP process did not stop within %g s; killing it", timeout_s)
        self._kill()
        if self._reader.is_alive():
            self._reader.join(5)

    def release(self) -> None:
        """Free the link of a front that ended on its own (its process is reaped already)."""
        self._kill()

    def _kill(self) -> None:
        self._stopping = True
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._sock.close()

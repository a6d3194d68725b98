"""The webhook receiver's HTTP front: its own process, serving HTTP while the ingest process persists.

Started by :class:`runtime.driver.webhook_link.FrontLink` as ``python -m runtime.driver.webhook_front
LINK_FD LISTEN_FD``; the parent created and bound the listening socket (so a port it cannot take is
the parent's error) and holds the other end of the link. Why a process: the receiver's two halves
(HTTP: connections, headers, answers; ingest: JSON, packing, the persist) each take about a core's
worth of CPU under load, and in one process they share one GIL (see ``webhook_link``).

What this process does for a records request: every check of the request (credentials,
Content-Type, Content-Length, the body size, its HMAC signature and the JSON itself, answered
401/413/415/400 here, as the one-process receiver does), then its records go over the link
("offer"); the ingest process queues them like any request, and settles it once persisted ("ok")
or not ("fail", "answer" with 503). A request not settled within ``reply_timeout_s`` is answered 503 here
and withdrawn there. ``/healthz`` and ``/readyz`` ask the ingest process (its queue, pause and
``ready_check``); either is 503 if it does not answer within ``ASK_TIMEOUT_S``.

Lifetime: the process ends when the link says "stop" or when the link closes (the ingest process
ended, or was killed with SIGKILL: the listening socket closes with this process, so nothing answers
for a dead ingest). It ignores SIGINT and SIGTERM, which a terminal or systemd sends the whole process
group: the ingest process decides when to stop, and answers the requests it holds before it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

import msgpack
from aiohttp import web

from runtime.driver.ready_probe import READY_TIMEOUT_S
from runtime.driver.webhook_body import BodyError, WebhookAuth, WebhookError, parse_records
from runtime.driver.webhook_http import HttpServer, _json, _time_out

ASK_TIMEOUT_S = READY_TIMEOUT_S + 1.0  # /readyz, /healthz: how long the ingest process may take to answer

Outcome = tuple[int, str | None, int]  # (HTTP status, why (non-2xx), records)


class RemoteIntake:
    """The HTTP side's end of the link (see the module notes); used on the server's loop only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, reply_timeout_s: float, retry_after_s: int) -> None:
        self.loop = loop
        self.reply_timeout_s = reply_timeout_s
        self.retry_after_s = retry_after_s
        self.transport: asyncio.Transport | None = None
        self._next = 0
        self._waiting: dict[int, asyncio.Future[Any]] = {}  # request or question id -> its answer
        self._out: list[bytes] = []
        self._answered: list[tuple[int, int]] = []
        self._flush_due = False

    # --- to the ingest process: one write per turn of the loop ---------------------------------
    def _send(self, frame: tuple[Any, ...]) -> None:
        self._out.append(msgpack.packb(frame))
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self._answered:
            self._out.append(msgpack.packb(("answered", self._answered)))
            self._answered = []
        if self.transport is None:  # requests came before the link was connected: sent once it is
            return
        out, self._out = self._out, []
        if not self.transport.is_closing():
            self.transport.write(b"".join(out))

    def _ask(self, frame_kind: str, *args: Any) -> tuple[int, asyncio.Future[Any]]:
        self._next += 1
        future: asyncio.Future[Any] = self.loop.create_future()
        self._waiting[self._next] = future
        self._send((frame_kind, self._next, *args))
        return self._next, future

    def forward(self, values: list[Any], body: bytes, content_type: str | None,
                batch: bool) -> tuple[int, asyncio.Future[Any]]:
        """Hand a request's records over; the future resolves to an :data:`Outcome` (None: timed out, see
        HttpServer). They travel as one msgpack array (about 10 us to pack and to unpack 100 small
        records, where the JSON parse took 77); a value msgpack cannot carry (an integer beyond 64
        bits, a string with a lone surrogate, nesting deeper than msgpack's 512) sends the body
        itself, parsed again over there with ``parse_records``: the same values either way."""
        try:
            packed = msgpack.packb(values)
        except (ValueError, TypeError, OverflowError):  # UnicodeEncodeError is a ValueError
            return self._ask("offer-body", body, content_type, batch)
        return self._ask("offer", packed)

    def withdraw(self, rid: int) -> None:
        self._waiting.pop(rid, None)
        self._send(("withdraw", rid))

    def answered(self, status: int, records: int) -> None:
        """An answer this process decided (a refused request, its own reply timeout, an empty body),
        sent at once: the ingest process's counters lag the client's answer by one hop only."""
        self._answered.append((status, records))
        self._flush()

    async def question(self, kind: str) -> Any:
        """The ingest process's answer to "ready?" or "health?"; TimeoutError after ASK_TIMEOUT_S."""
        rid, future = self._ask(kind)
        try:
            return await asyncio.wait_for(future, ASK_TIMEOUT_S)
        finally:
            self._waiting.pop(rid, None)

    # --- from the ingest process ----------------------------------------------------------------
    def _resolve(self, rid: int, value: Any) -> None:
        future = self._waiting.pop(rid, None)
        if future is not None and not future.done():
            future.set_result(value)

    def received(self, frame: Sequence[Any]) -> bool:
        """Apply one frame; False for "stop"."""
        kind = frame[0]
        if kind == "ok":
            for rid, records in frame[1]:
                self._resolve(rid, (200, None, records))
        elif kind == "fail":
            for rid in frame[1]:
                self._resolve(rid, (503, "ingest stopped before persist", 0))
        elif kind == "answer":
            self._resolve(frame[1], (frame[2], frame[3], frame[4]))
        elif kind == "reply":
            self._resolve(frame[1], frame[2])
        elif kind == "stop":
            return False
        return True


class _LinkProtocol(asyncio.Protocol):
    def __init__(self, intake: RemoteIntake, unpacker: msgpack.Unpacker, ended: threading.Event) -> None:
        self.intake = intake
        self.unpacker = unpacker
        self.ended = ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.intake.transport = transport
        self._frames()  # what came with the config frame
        self.intake._send(("up",))  # after anything sent before the link was connected

    def data_received(self, data: bytes) -> None:
        self.unpacker.feed(data)
        self._frames()

    def _frames(self) -> None:
        for frame in self.unpacker:
            if not self.intake.received(frame):
                self.ended.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set()


class FrontServer(HttpServer):
    """:class:`HttpServer` whose records, health and readiness are the ingest process's (module notes)."""

    def __init__(self, remote: RemoteIntake, sock: socket.socket, **options: Any) -> None:
        self.remote = remote
        # the handlers that use the Intake protocol (records, health, readiness) are the ones overridden here
        super().__init__(remote, sock, **options)  # type: ignore[arg-type]

    async def _take(self, request: web.Request, *, batch: bool) -> web.Response:
        try:
            body, content_type = await self._body(request)
            values = parse_records(body, content_type, batch=batch)
        except BodyError as exc:
            return self._refuse(exc.status, str(exc))
        if not values:
            self.intake.answered(200, 0)
            return _json(200, {"accepted": 0})
        remote = self.remote
        rid, future = remote.forward(values, body, content_type, batch)
        timer = self.loop.call_later(remote.reply_timeout_s, _time_out, future)
        try:
            outcome: Outcome | None = await future
        finally:
            timer.cancel()
        if outcome is None:  # _time_out: the answer gives up; records never polled are taken back
            remote.withdraw(rid)
            return self._busy("not confirmed in time", 0)
        # the ingest process decided, and counted the answer as it did (module notes of webhook_link)
        status, why, _records = outcome
        if status == 200:
            return _json(200, {"accepted": _records})
        if status == 503:
            return self._busy_answer(why or "not persisted")
        return self._refusal(status, why or "refused")

    async def _healthz(self, _request: web.Request) -> web.Response:
        """200 with the ingest process's counters; 503 if it does not answer (stopped, wedged): the
        receiver is not alive when only its HTTP side is, and a liveness probe must see it."""
        try:
            doc = await self.remote.question("health?")
        except asyncio.TimeoutError:
            return _json(503, {"ok": False, "why": f"the ingest process did not answer within {ASK_TIMEOUT_S:g} s"})
        return _json(200, {"ok": True, **doc})

    async def _readyz(self, _request: web.Request) -> web.Response:
        try:
            why = await self.remote.question("ready?")
        except asyncio.TimeoutError:
            why = f"the ingest process did not answer within {ASK_TIMEOUT_S:g} s"
        if why is not None:
            return _json(503, {"ready": False, "why": why})
        return _json(200, {"ready": True})


def _config(link: socket.socket, unpacker: msgpack.Unpacker) -> dict[str, Any]:
    """The first frame on the link: ("config", {...}) (see FrontLink)."""
    while True:
        data = link.recv(1 << 16)
        if not data:
            raise SystemExit(0)  # the ingest process went away before it configured us
        unpacker.feed(data)
        for frame in unpacker:
            if frame[0] != "config":
                msg = f"webhook front: expected the config frame, got {frame[0]!r}"
                raise SystemExit(msg)
            config: dict[str, Any] = frame[1]
            return config


def main(argv: Sequence[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # see the module notes: the link decides
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    link = socket.socket(fileno=int(argv[0]))
    listener = socket.socket(fileno=int(argv[1]))
    listener.setblocking(False)
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=0)
    config = _config(link, unpacker)
    tls = None
    if config["tls"] is not None:
        from runtime.driver.webhook_tls import tls_context

        try:  # the files may have changed since the ingest process loaded them (a restart after a rotation)
            tls = tls_context(*config["tls"])
        except WebhookError as exc:  # the reason goes to the ingest process, which names it: no traceback
            with contextlib.suppress(OSError):  # the ingest process gone too: nobody to tell
                link.sendall(msgpack.packb(("error", str(exc))))
            return 2
    loop = asyncio.new_event_loop()
    remote = RemoteIntake(loop, config["reply_timeout_s"], config["retry_after_s"])
    server = FrontServer(remote, listener, path=config["path"],
                         auth=WebhookAuth(token=config["token"], hmac_secret=config["hmac_secret"]),
                         max_body_bytes=config["max_body_bytes"], ssl_context=tls, loop=loop)
    ended = threading.Event()

    async def connect() -> None:
        link.setblocking(False)
        await loop.connect_accepted_socket(lambda: _LinkProtocol(remote, unpacker, ended), link)

    asyncio.run_coroutine_threadsafe(connect(), loop).result(30)
    ended.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

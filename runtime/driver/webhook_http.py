"""The webhook receiver's HTTP server: aiohttp on an event loop of its own thread, beside ingest.

Why aiohttp (``pip install 'ftlayer[webhook]'``): a maintained asyncio HTTP/1.1 server (and client)
in one package, with keep-alive, TLS through an :class:`ssl.SSLContext`, a request size limit
(``client_max_size``) and 405/404 routing built in, and a C parser (llhttp). Its handlers are
coroutines, so a request waiting for its records to be persisted holds no thread: thousands of
client connections can wait on one ingest thread. uvicorn+starlette would need two packages
and an ASGI layer; hypercorn is slower; the stdlib server has no keep-alive worth the name.

Contract with the source (:class:`runtime.driver.webhook.WebhookSource`, the :class:`Intake`
protocol): ``offer(values)`` queues a request's records and returns a ticket whose ``future``
(bound to this server's loop) resolves True once ingest confirmed them all, False if they were
abandoned; or it returns a string saying why not (answered 503). The handler awaits that future
itself, with a timer of the loop for ``reply_timeout_s`` that resolves it None (one wake-up per
answer, not ``wait_for`` and ``shield``'s three); then ``withdraw(ticket)`` is called: the
source takes back records never polled, and a confirmation coming later finds the future done.

Routes (``path`` ends with "/"): ``POST <path>`` and ``POST <path>batch`` (records, see
:mod:`runtime.driver.webhook_body`), ``GET /healthz`` and ``GET /readyz`` (no credentials
needed). Every answer is a JSON object; errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError

from ftlayer.logs import logger_for
from runtime.driver.ready_probe import ReadyProbe
from runtime.driver.webhook_body import BodyError, WebhookAuth, body_kind, parse_records

log = logger_for(__name__)

KEEPALIVE_S = 75.0  # idle keep-alive connections are closed after this (longer than most load balancers' 60 s)
SETTLE_TURNS = 5  # stop(): turns of the loop for a connection accepted already to reach aiohttp


class Ticket(Protocol):
    values: list[Any]
    @property
    def future(self) -> asyncio.Future[bool | None] | None: ...  # never None for a ticket offer() returned


class Intake(Protocol):
    """What the HTTP side needs of the source (see the module contract)."""

    reply_timeout_s: float
    retry_after_s: int

    def offer(self, values: list[Any], loop: asyncio.AbstractEventLoop) -> Ticket | str: ...
    def withdraw(self, ticket: Ticket) -> None: ...
    def answered(self, status: int, records: int) -> None: ...
    def readiness(self) -> str | None: ...
    def health(self) -> dict[str, Any]: ...


def _time_out(future: asyncio.Future[Any]) -> None:
    """``reply_timeout_s`` passed: resolve the ticket's future with None (not confirmed in time), so
    its handler answers 503; a confirmation coming later finds the future done and is dropped."""
    if not future.done():
        future.set_result(None)


def _json(status: int, doc: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(doc).encode(), content_type="application/json",
                        headers=headers)


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]  # generic only in typeshed
    """aiohttp's server log, but a request it could not parse (an HTTP/2 preface, a bad header line:
    the client's error, answered with aiohttp's 400) is one INFO line, not an ERROR with a traceback
    on the receiver's stderr for each one (a port scanner, a probe speaking HTTP/2); an exception
    of a handler is still logged whole."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            first = (exc_info.message or "").strip().splitlines()[:1]
            self.logger.info(f"{msg}: %s %s", *args, exc_info.code, first[0] if first else "")
            return
        self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


@web.middleware
async def _json_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
    """aiohttp's own 404, 405 and 413 as JSON bodies (its Allow header kept)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        text = {404: f"no route {request.path}", 405: f"{request.method} is not allowed on {request.path}",
                413: "the body is too large"}.get(exc.status, exc.reason)
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return _json(exc.status, {"error": text}, headers)


class HttpServer:
    """The aiohttp application of one :class:`Intake`, served on ``sock`` until :meth:`stop`."""

    def __init__(self, intake: Intake, sock: socket.socket, *, path: str, auth: WebhookAuth,
                 max_body_bytes: int, ssl_context: ssl.SSLContext | None,
                 ready_check: Callable[[], object] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.intake = intake
        self.path = path
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self._probe_runs = ReadyProbe(ready_check)
        self._sock = sock
        self.loop = loop or asyncio.new_event_loop()
        app = web.Application(client_max_size=max_body_bytes, middlewares=[_json_errors])
        app.router.add_post(path, self._records, expect_handler=self._expect)
        if path != "/":  # path="/in": POST /in takes records too, as does /in/
            app.router.add_post(path.rstrip("/"), self._records, expect_handler=self._expect)
        app.router.add_post(path + "batch", self._batch, expect_handler=self._expect)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=KEEPALIVE_S,
                                     shutdown_timeout=2.0, logger=_ServerLog(logging.getLogger("aiohttp.server")))
        self._thread = threading.Thread(target=self.loop.run_forever, name="ftlayer-webhook", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(sock, ssl_context), self.loop).result(30)

    async def _start(self, sock: socket.socket, ssl_context: ssl.SSLContext | None) -> None:
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=ssl_context).start()

    def stop(self) -> None:
        """Close the listening socket and every connection, then end the loop's thread."""
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
            self.loop.close()

    async def _stop(self) -> None:
        """Stop accepting, let the connections accepted already reach aiohttp, then its cleanup.

        asyncio (3.11) makes a transport for an accepted connection a turn of the loop after the
        accept; if the server was closed in between, making it fails (an assertion in
        ``Server._attach``) and the socket stays open unanswered: its client would wait until its
        own timeout instead of seeing the connection reset and retrying. So the listening socket
        is taken out of the loop first, and the cleanup (which closes it) comes once those
        connections are aiohttp's, which closes them."""
        self.loop.remove_reader(self._sock)
        for _ in range(SETTLE_TURNS):
            await asyncio.sleep(0)
        await self._runner.cleanup()
        # what aiohttp's cleanup leaves behind (a connection's handler still lingering over the body of a
        # refused request, up to aiohttp's 10 s): cancelled and awaited here, so closing the loop destroys no
        # pending task ("Task was destroyed but it is pending!" on stderr)
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    # --- handlers -------------------------------------------------------------------------------
    async def _expect(self, request: web.Request) -> web.Response | None:
        """``Expect: 100-continue``: the checks that need no body (credentials, Content-Type,
        Content-Length) answer before the client uploads it, instead of after (aiohttp's own handler
        says "100 Continue" to any request, so a body over the limit was sent in full to get its
        413). A refusal closes the connection: the body the client held back is never read."""
        expect = request.headers.get("Expect", "")
        if request.version != HttpVersion11:
            return None
        if expect.lower() != "100-continue":
            msg = f"Unknown Expect: {expect}"
            raise web.HTTPExpectationFailed(text=msg)
        try:
            self._checks_before_the_body(request)
        except BodyError as exc:
            response = self._refuse(exc.status, str(exc))
            response.force_close()
            return response
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the 100 is not part of the answer's size (as aiohttp's own handler)
        return None

    async def _records(self, request: web.Request) -> web.Response:
        return await self._take(request, batch=False)

    async def _batch(self, request: web.Request) -> web.Response:
        return await self._take(request, batch=True)

    def _refuse(self, status: int, why: str, records: int = 0) -> web.Response:
        self.intake.answered(status, records)
        return self._refusal(status, why)

    def _refusal(self, status: int, why: str) -> web.Response:
        headers = {"WWW-Authenticate": 'Bearer realm="ftlayer"'} if status == 401 and self.auth.token else None
        return _json(status, {"error": why}, headers)

    async def _take(self, request: web.Request, *, batch: bool) -> web.Response:
        try:
            values = await self._values(request, batch=batch)
        except BodyError as exc:
            return self._refuse(exc.status, str(exc))
        if not values:
            self.intake.answered(200, 0)
            return _json(200, {"accepted": 0})
        return await self._confirm(values)

    async def _values(self, request: web.Request, *, batch: bool) -> list[Any]:
        """The request's records; BodyError (401, 413, 415, 400) for a request refused."""
        body, content_type = await self._body(request)
        return parse_records(body, content_type, batch=batch)

    def _checks_before_the_body(self, request: web.Request) -> str | None:
        """The request's Content-Type once its token, type and Content-Length passed; BodyError (401,
        415, 413) otherwise."""
        why = self.auth.check_token(request.headers)
        if why is not None:
            raise BodyError(why, 401)
        content_type = request.headers.get("Content-Type")
        body_kind(content_type)
        length = request.content_length
        if length is not None and length > self.max_body_bytes:
            msg = f"the body has {length} bytes; at most {self.max_body_bytes} are taken"
            raise BodyError(msg, 413)
        return content_type

    async def _body(self, request: web.Request) -> tuple[bytes, str | None]:
        """The request's body and Content-Type once its credentials, type and size passed; BodyError
        (401, 413, 415) for a request refused. The cheap checks (token, Content-Type,
        Content-Length) come before the body is read (and, for ``Expect: 100-continue``, before the
        client sends it: :meth:`_expect`)."""
        content_type = self._checks_before_the_body(request)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:  # chunked, no Content-Length: aiohttp counted
            msg = f"the body has more than {self.max_body_bytes} bytes"
            raise BodyError(msg, 413) from exc
        why = self.auth.check_signature(request.headers, body)
        if why is not None:
            raise BodyError(why, 401)
        return body, content_type

    async def _confirm(self, values: list[Any]) -> web.Response:
        """Hand the records to ingest and answer once they are persisted (200) or not (503)."""
        intake = self.intake
        ticket = intake.offer(values, self.loop)
        if isinstance(ticket, str):
            return self._busy(ticket, len(values))
        future = ticket.future
        assert future is not None  # offer() binds every ticket it returns to this loop
        timer = self.loop.call_later(intake.reply_timeout_s, _time_out, future)
        try:
            ok = await future
        finally:
            timer.cancel()
        if ok is None:  # _time_out: the answer gives up
            intake.withdraw(ticket)
            return self._busy("not confirmed in time", len(values))
        if ok:
            intake.answered(200, len(values))
            return _json(200, {"accepted": len(values)})
        return self._busy("ingest stopped before persist", len(values))

    def _busy(self, why: str, records: int) -> web.Response:
        self.intake.answered(503, records)
        return self._busy_answer(why)

    def _busy_answer(self, why: str) -> web.Response:
        return _json(503, {"error": why}, {"Retry-After": str(self.intake.retry_after_s)})

    async def _healthz(self, _request: web.Request) -> web.Response:
        return _json(200, {"ok": True, **self.intake.health()})

    async def _readyz(self, _request: web.Request) -> web.Response:
        why = self.intake.readiness() or await self._probe()
        if why is not None:
            return _json(503, {"ready": False, "why": why})
        return _json(200, {"ready": True})

    async def _probe(self) -> str | None:
        """Run ``ready_check`` (Redis PING) off the loop (:class:`~runtime.driver.ready_probe.ReadyProbe`)."""
        if not self._probe_runs.configured:
            return None
        return await self.loop.run_in_executor(None, self._probe_runs.check)

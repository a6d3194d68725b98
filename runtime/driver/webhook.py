"""An HTTP webhook receiver as an ftlayer source: a client gets 2xx only once its records are persisted.

::

    hooks = WebhookSource(port=8080)                 # POST http://127.0.0.1:8080/ with a JSON body
    topo.source("events", hooks, key=lambda e: e["user"]).map(...).sink(...)
    query = topo.start(spark)
    ...
    hooks.end()                                      # stop taking records; the source ends when drained

Protocol (HTTP/1.0, one request per connection, stdlib ``http.server`` in daemon threads):

- ``POST <path>`` with a JSON body: one record (the decoded value). ``POST <path>batch`` with a
  JSON array: one record per element, confirmed together.
- **200** ``{"accepted": n}``: every record of the request is persisted (durable as the
  ``durability`` mode promises) or, if ingest refused it (its key selector raised), dead-lettered
  with the reason. It is the source's ``ack`` hook (see :mod:`runtime.driver.ingest`) that answers.
- **503** with ``Retry-After`` (seconds): nothing of the request was taken, or it may not have been
  persisted: ingest is paused (backpressure: ``max_pending`` records pending; or Redis is
  unreachable), ``max_queued`` records wait already, the source is ending, or no confirmation came
  within ``reply_timeout_s``. The client must retry; a retry after a 503 can deliver the record
  twice (at-least-once), never lose it.
- **400** (body is not JSON, is ``null`` or holds one, or ``/batch`` got no array) and **413** (body over
  ``max_body_bytes``): do not retry.

Guarantee: a record confirmed with 2xx is never lost, whatever happens to the driver afterwards
(it is in Redis). A client that retries every non-2xx answer and every connection error until it
gets a 2xx therefore loses nothing, even across a driver kill -9 and restart on the same port.
Records a killed driver had taken but not persisted were never confirmed, so the client sends
them again.

Ordering: records are handed to ingest in arrival order; ``ack`` is called in the same order, so
the receiver matches confirmations to requests by counting (a FIFO of waiting requests).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ftlayer.logs import logger_for

log = logger_for(__name__)


@dataclass(eq=False)
class _Ticket:
    """One request's records: handed to ingest, then confirmed by ``ack`` (or abandoned)."""

    values: list[Any]
    remaining: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False

    def __post_init__(self) -> None:
        self.remaining = len(self.values)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class WebhookSource:
    """An open/poll/close source fed by HTTP POSTs, with the ``ack`` and ``ingest_paused`` hooks.

    The server listens from construction (``port=0`` picks a free port; :attr:`url` names it)
    until :meth:`close`; :meth:`open` after a close listens again on the same port, so a restarted
    topology can take the same object.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        path: str = "/",
        max_queued: int = 10_000,
        reply_timeout_s: float = 30.0,
        retry_after_s: int = 1,
        max_body_bytes: int = 1 << 20,
        chunk: int = 1000,
    ) -> None:
        self.host = host
        self.port = port
        self.path = path if path.endswith("/") else path + "/"
        self.max_queued = max_queued
        self.reply_timeout_s = reply_timeout_s
        self.retry_after_s = retry_after_s
        self.max_body_bytes = max_body_bytes
        self.chunk = chunk
        self.confirmed = 0  # records answered 2xx
        self.refused = 0  # requests answered 503
        self._lock = threading.Condition()
        self._queue: deque[_Ticket] = deque()  # taken, not yet polled
        self._queued = 0  # records in _queue
        self._inflight: deque[_Ticket] = deque()  # polled, waiting for ack, in poll order
        self._paused: str | None = None
        self._ending = False
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._listen()

    # --- the server -------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The URL to POST single records to (``url + "batch"`` for arrays)."""
        return f"http://{self.host}:{self.port}{self.path}"

    def _listen(self) -> None:
        if self._server is not None:
            return
        source = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the http.server name
                source._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # the stdlib signature
                log.debug("webhook %s: " + format, source.url, *args)

        self._server = _Server((self.host, self.port), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="ftlayer-webhook", daemon=True)
        self._thread.start()

    def _read_values(self, req: BaseHTTPRequestHandler) -> list[Any] | None:
        """The request's records, or None after answering 404/413/400."""
        route = req.path.split("?", 1)[0]
        if route not in (self.path, self.path + "batch"):
            self._reply(req, 404, {"error": f"POST to {self.path} or {self.path}batch"})
            return None
        try:
            length = int(req.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > self.max_body_bytes:
            self._reply(req, 413, {"error": f"body must have a Content-Length of at most {self.max_body_bytes}"})
            return None
        try:
            value = json.loads(req.rfile.read(length))
        except ValueError as exc:
            self._reply(req, 400, {"error": f"body is not JSON: {exc}"})
            return None
        values = value if route.endswith("batch") else [value]
        if not isinstance(values, list):
            self._reply(req, 400, {"error": "a batch body must be a JSON array"})
            return None
        if any(v is None for v in values):
            # ingest reads None as "nothing yet": taken, it would shift every later confirmation
            self._reply(req, 400, {"error": "null is not a record"})
            return None
        return values

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        values = self._read_values(req)
        if values is None:
            return
        if not values:
            self._reply(req, 200, {"accepted": 0})
            return
        ticket = self._offer(values)
        if isinstance(ticket, str):
            self._busy(req, ticket)
            return
        if ticket.done.wait(self.reply_timeout_s) and ticket.ok:
            with self._lock:
                self.confirmed += len(values)
            self._reply(req, 200, {"accepted": len(values)})
            return
        with self._lock:
            if ticket in self._queue:  # never polled: withdraw it, so a retry makes no duplicate
                self._queue.remove(ticket)
                self._queued -= len(ticket.values)
        self._busy(req, "not confirmed in time" if not ticket.done.is_set() else "ingest stopped before persist")

    def _offer(self, values: list[Any]) -> _Ticket | str:
        """Queue a request's records, or say why not (503)."""
        with self._lock:
            if self._ending or self._server is None:
                return "the source is ending"
            if self._paused is not None:
                return f"ingest paused: {self._paused}"
            if self._queued + len(values) > self.max_queued and self._queued > 0:
                return f"{self._queued} records queued (max_queued {self.max_queued})"
            ticket = _Ticket(values)
            self._queue.append(ticket)
            self._queued += len(values)
            self._lock.notify_all()
            return ticket

    def _busy(self, req: BaseHTTPRequestHandler, why: str) -> None:
        with self._lock:
            self.refused += 1
        self._reply(req, 503, {"error": why}, retry_after=self.retry_after_s)

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, status: int, doc: dict[str, Any], retry_after: int | None = None) -> None:
        data = json.dumps(doc).encode()
        try:
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(data)))
            if retry_after is not None:
                req.send_header("Retry-After", str(retry_after))
            req.end_headers()
            req.wfile.write(data)
        except OSError:  # the client went away; it will retry
            log.debug("webhook client of %s went away before its %d answer", req.path, status)

    # --- the source protocol (runtime.driver.ingest) ---------------------------------------------
    def open(self) -> None:
        self._listen()

    def poll(self) -> Iterable[Any] | None:
        """Records of waiting requests (up to ``chunk``, whole requests), [] if none came within
        50 ms, None once :meth:`end` was called and every request taken was handed over."""
        with self._lock:
            if not self._queue:
                if self._ending:
                    return None
                self._lock.wait(0.05)
            out: list[Any] = []
            while self._queue and (not out or len(out) + len(self._queue[0].values) <= self.chunk):
                ticket = self._queue.popleft()
                self._queued -= len(ticket.values)
                self._inflight.append(ticket)
                out.extend(ticket.values)
            return out

    def ack(self, values: list[Any]) -> None:
        """Ingest's confirmation: ``values`` (the next ones in poll order) are safe; answer 2xx."""
        n = len(values)
        with self._lock:
            while n and self._inflight:
                ticket = self._inflight[0]
                take = min(n, ticket.remaining)
                ticket.remaining -= take
                n -= take
                if ticket.remaining == 0:
                    self._inflight.popleft()
                    ticket.ok = True
                    ticket.done.set()

    def ingest_paused(self, reason: str | None) -> None:
        """Ingest waits (backpressure, Redis unreachable): answer new requests 503 until it goes on."""
        with self._lock:
            self._paused = reason

    def end(self) -> None:
        """Take no more records (503); :meth:`poll` ends the source once the queue is handed over."""
        with self._lock:
            self._ending = True
            self._lock.notify_all()

    def close(self) -> None:
        """Stop listening; requests still waiting get 503 (the client retries them)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            waiting = list(self._inflight) + list(self._queue)
            self._inflight.clear()
            self._queue.clear()
            self._queued = 0
        for ticket in waiting:
            ticket.done.set()  # ok stays False: 503

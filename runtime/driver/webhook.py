"""An HTTP webhook receiver as an ftlayer source: a client gets 2xx only once its records are persisted.

::

    hooks = WebhookSource(port=8080, token="s3cret")   # POST http://127.0.0.1:8080/ with a JSON body
    topo.source("events", hooks, key=lambda e: e["user"]).map(...).sink(...)
    query = topo.start(spark)
    ...
    hooks.end()                                        # stop taking records; the source ends when drained

The server is aiohttp (HTTP/1.1 keep-alive, optional TLS; :mod:`runtime.driver.webhook_http` says
why), by default in a process of its own (the *front*, :mod:`runtime.driver.webhook_link` says
why and how) and with ``front="thread"`` on an event loop in a thread of this process; ingest
pulls from the source like any poll source, and every decision about records is taken here.

Protocol (the full table: docs/sources.md):

- ``POST <path>`` with a JSON body: one record (the decoded value). ``POST <path>batch`` with a
  JSON array: one record per element. Either with ``Content-Type: application/x-ndjson``: one
  record per line. A request's records are confirmed together.
- **200** ``{"accepted": n}``: every record of the request is persisted (durable as the
  ``durability`` mode promises) or, if ingest refused it (its key selector raised), dead-lettered
  with the reason. It is the source's ``ack`` hook (see :mod:`runtime.driver.ingest`) that answers.
- **503** with ``Retry-After`` (seconds): nothing of the request was taken, or it may not have been
  persisted: ingest is paused (backpressure: ``max_pending`` records pending; or Redis is
  unreachable), ``max_queued`` records wait already, the source is ending, or no confirmation came
  within ``reply_timeout_s``. The client must retry; a retry after a 503 can deliver the record
  twice (at-least-once), never lose it.
- **400** (a body that is not JSON, a ``null`` record, a batch that is not an array, a bad NDJSON
  line, named), **401** (``token`` or ``hmac_secret`` set and the request's ``Authorization:
  Bearer`` or ``X-Hub-Signature-256`` is missing or wrong), **413** (body over ``max_body_bytes``),
  **415** (another Content-Type), **404**, **405**: do not retry.
- ``GET /healthz``: 200 while the process serves; ``GET /readyz``: 200 when a request would be
  taken now (ingest polls this source, is not paused, the source is not ending, and
  ``ready_check``, e.g. a Redis PING, passes within 2 s), else 503 with the reason.

Guarantee: a record confirmed with 2xx is never lost, whatever happens to the driver afterwards
(it is in Redis). A client that retries every non-2xx answer and every connection error until it
gets a 2xx therefore loses nothing, even across a driver kill -9 and restart on the same port.
Records a killed driver had taken but not persisted were never confirmed, so the client sends
them again.

Ordering: records are handed to ingest in arrival order; ``ack`` is called in the same order, so
the receiver matches confirmations to requests by counting (a FIFO of waiting requests).
"""

from __future__ import annotations

__all__ = ["FRONTS", "HANDOFF_S", "WebhookError", "WebhookSource", "tls_context"]

import asyncio
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ftlayer.logs import logger_for
from runtime.driver.webhook_body import BodyError, WebhookAuth, WebhookError, parse_records
from runtime.driver.webhook_tickets import Ticket, settle_soon
from runtime.driver.webhook_tls import TLS_FILES, tls_context, tls_unpassable

if TYPE_CHECKING:
    from runtime.driver.webhook_link import FrontLink

log = logger_for(__name__)

STALE_POLL_S = 10.0  # /readyz: ingest must have polled within this long (else no ingest runs the source)
IDLE_POLL_S = 0.05  # poll(): how long it waits for a request while nothing is queued nor in flight
# ack(): how long ingest waits for the server's loop to have answered the requests it confirmed before
# it goes on (to the next batch's packing and encoding, which hold the GIL the loop needs to answer)
HANDOFF_S = 0.002
FRONTS = ("auto", "process", "thread")
# a front process that ends on its own is started again on the same port, at most this many times within
# the window (a front that keeps dying is a fault for the operator: ingest then stops with the reason)
FRONT_RESTARTS = 3
FRONT_RESTART_WINDOW_S = 60.0


class WebhookSource:
    """An open/poll/close source fed by HTTP POSTs, with the ``ack`` and ``ingest_paused`` hooks.

    The server listens from construction (``port=0`` picks a free port; :attr:`url` names it)
    until :meth:`close`; :meth:`open` after a close listens again on the same port, so a restarted
    topology can take the same object. ``token`` / ``hmac_secret``: the credentials every POST must
    carry (see :mod:`runtime.driver.webhook_body`); ``tls``: a server :class:`ssl.SSLContext`
    (:func:`tls_context`); ``ready_check``: a callable that raises when the records could not be
    persisted now (``GET /readyz``; the CLI pings Redis; it runs in this process). ``front``: where the
    HTTP side runs, "process" (a front process, :mod:`runtime.driver.webhook_link`), "thread" (an event
    loop in a thread here) or "auto" ("process" unless ``tls`` cannot be handed to another process: a
    context :func:`tls_context` did not build, or one changed since, see :func:`tls_unpassable`). The
    counters (``confirmed``, ``refused``, ``answers``) count what this process decided as it decides
    it (a 200 as ingest confirms it: a front killed at that moment may take counted answers with it,
    at most the requests it held), and what the front decided (4xx, its reply timeouts) as the front
    reports it, a moment after the client's answer.
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
        token: str | None = None,
        hmac_secret: str | bytes | None = None,
        tls: ssl.SSLContext | None = None,
        ready_check: Callable[[], object] | None = None,
        backlog: int = 1024,
        front: str = "auto",
    ) -> None:
        if front not in FRONTS:
            msg = f"WebhookSource(front={front!r}): front must be one of {', '.join(FRONTS)}"
            raise WebhookError(msg)
        why = tls_unpassable(tls) if front == "process" else None
        if why is not None:
            msg = (f"WebhookSource(front='process') cannot pass this TLS context to the HTTP process: {why}; "
                   "build it with tls_context(cert, key) and change nothing, or use front='thread'")
            raise WebhookError(msg)
        self.front = front
        self.host = host
        self.port = port
        self.path = ("/" + path.strip("/") + "/").replace("//", "/")
        self.max_queued = max_queued
        self.reply_timeout_s = reply_timeout_s
        self.retry_after_s = retry_after_s
        self.max_body_bytes = max_body_bytes
        self.chunk = chunk
        secret = hmac_secret.encode() if isinstance(hmac_secret, str) else hmac_secret
        self.auth = WebhookAuth(token=token or None, hmac_secret=secret or None)
        self.tls = tls
        self.ready_check = ready_check
        self.backlog = backlog
        self.confirmed = 0  # records answered 2xx
        self.refused = 0  # requests answered 503
        self.answers: dict[int, int] = {}  # HTTP status -> requests answered with it
        self._lock = threading.Condition()
        self._queue: deque[Ticket] = deque()  # taken, not yet polled
        self._queued = 0  # records in _queue
        self._inflight: deque[Ticket] = deque()  # polled, waiting for ack, in poll order
        self._paused: str | None = None
        self._ending = False
        self._last_poll: float | None = None  # monotonic time of ingest's last poll
        self._wake_due = False  # a wake of ingest is scheduled on the server's loop (see offer)
        self._server: Any = None  # webhook_http.HttpServer or webhook_link.FrontLink while listening
        self._front_lost: str | None = None  # why the HTTP process ended on its own, not started again
        self._front_deaths: list[float] = []  # monotonic times a front ended on its own (front_lost)
        self._closed = False
        self._listen()

    # --- the server -------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The URL to POST single records to (``url + "batch"`` for arrays)."""
        scheme = "https" if self.tls is not None else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}{self.path}"

    @property
    def front_process(self) -> bool:
        """True when the HTTP side runs in a process of its own (``front``: "process", or "auto"
        unless ``tls`` is a context :func:`tls_context` did not build, or one changed since); see
        :mod:`runtime.driver.webhook_link`."""
        if self.front == "auto":
            return tls_unpassable(self.tls) is None
        return self.front == "process"

    @property
    def front_pid(self) -> int | None:
        """The pid of the HTTP front process while it serves (None: the HTTP side runs in a thread here)."""
        return getattr(self._server, "pid", None)

    @property
    def front_failure(self) -> WebhookError | None:
        """Why the HTTP front process is not started again (it kept dying, or a new one failed to start),
        the error :meth:`poll` raises once the records held are handed over; None while a front serves
        (or the HTTP side runs in a thread). For a caller that must stop ingest while it is paused
        (backpressure, Redis unreachable), when it does not poll: ``ftlayer ingest`` does."""
        with self._lock:
            return None if self._front_lost is None else WebhookError(self._front_lost)

    def _listen(self) -> None:
        if self._server is not None:
            return
        try:
            from runtime.driver.webhook_http import HttpServer  # aiohttp: the [webhook] extra
        except ImportError as exc:
            msg = "the webhook receiver needs aiohttp: pip install 'ftlayer[webhook]'"
            raise WebhookError(msg) from exc

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart rebinds at once
            sock.bind((self.host, self.port))
            sock.listen(self.backlog)
            sock.setblocking(False)
            self.port = int(sock.getsockname()[1])
            self._front_lost = None
            if self.front_process:
                from runtime.driver.webhook_link import FrontLink

                link = FrontLink(self, sock, self._front_config(), ready_check=self.ready_check)
                sock.close()  # the front process serves it; ours would only queue connections nobody takes
                self._server = link
                link.start()
            else:
                self._server = HttpServer(self, sock, path=self.path, auth=self.auth,
                                          max_body_bytes=self.max_body_bytes, ssl_context=self.tls,
                                          ready_check=self.ready_check)
        except BaseException:
            sock.close()
            raise

    def _front_config(self) -> dict[str, Any]:
        return {"path": self.path, "max_body_bytes": self.max_body_bytes, "token": self.auth.token,
                "hmac_secret": self.auth.hmac_secret, "reply_timeout_s": self.reply_timeout_s,
                "retry_after_s": self.retry_after_s,
                "tls": None if self.tls is None else list(getattr(self.tls, TLS_FILES))}

    # --- what the HTTP side calls (runtime.driver.webhook_http.Intake) -----------------------------
    def offer(self, values: list[Any], loop: asyncio.AbstractEventLoop) -> Ticket | str:
        """Queue a request's records, or say why not (503)."""
        with self._lock:
            ticket = self._admit(Ticket(values, loop.create_future(), loop))
            if not isinstance(ticket, str) and not self._wake_due:
                self._wake_due = True  # ingest is woken once per turn of the loop, not per request
                loop.call_soon(self.wake)
            return ticket

    def _admit(self, ticket: Ticket) -> Ticket | str:
        """Queue ``ticket`` (under the lock), or say why not."""
        if self._ending or self._server is None:
            return "the source is ending"
        if self._paused is not None:
            return f"ingest paused: {self._paused}"
        values = ticket.values
        if self._queued + len(values) > self.max_queued and self._queued > 0:
            return f"{self._queued} records queued (max_queued {self.max_queued})"
        self._queue.append(ticket)
        self._queued += len(values)
        return ticket

    def wake(self) -> None:
        """After the requests read in one turn of the server's loop (or one read of the front's link)
        were offered: let ingest take them all at once (one hand-over and one persist for a burst of
        requests, instead of a thread switch per request while the others are still being read)."""
        with self._lock:
            self._wake_due = False
            self._lock.notify_all()

    def withdraw(self, ticket: Any) -> None:
        """The answer gave up waiting: take back the records if ingest never polled them (a retry
        then makes no duplicate); polled ones stay in flight and are persisted anyway."""
        with self._lock:
            if ticket in self._queue:
                self._queue.remove(ticket)
                self._queued -= len(ticket.values)

    # --- what the front process sends (runtime.driver.webhook_link.LinkedSource) ----------------------
    def take_body(self, link: FrontLink, rid: int, body: bytes, content_type: str | None, batch: bool) -> None:
        """A records request from the front as its body (its records would not fit msgpack): parsed here."""
        try:
            values = parse_records(body, content_type, batch=batch)
        except BodyError as exc:  # the front parsed it already; only a change of mind would get here
            self.answered(exc.status, 0)
            link.answer(rid, exc.status, str(exc), 0)
            return
        self.take(link, rid, values)

    def take(self, link: FrontLink, rid: int, values: list[Any]) -> None:
        """A records request from the front, taken as :meth:`offer` takes one; a refusal (503) or an empty
        request (200) is answered at once. The answers decided here are counted here (``answers``,
        ``confirmed``, ``refused``), before the front writes them."""
        if not values:
            self.answered(200, 0)
            link.answer(rid, 200, None, 0)
            return
        with self._lock:
            ticket = self._admit(Ticket(values, link=link, rid=rid))
        if isinstance(ticket, str):
            self.answered(503, len(values))
            link.answer(rid, 503, ticket, len(values))

    def withdraw_request(self, link: FrontLink, rid: int) -> None:
        """The front answered 503 (not confirmed in time), and counted it: as :meth:`withdraw`; a ticket
        already polled is persisted anyway, uncounted."""
        with self._lock:
            for ticket in self._queue:
                if ticket.rid == rid and ticket.link is link:
                    self._queue.remove(ticket)
                    self._queued -= len(ticket.values)
                    return
            for ticket in self._inflight:
                if ticket.rid == rid and ticket.link is link:
                    ticket.withdrawn = True
                    return

    def front_lost(self, link: FrontLink, why: str) -> None:
        """The front process ended without being told to (killed, crashed): its clients saw their
        connections reset and retry. The records of its requests not yet polled are taken back (a
        retry then makes no duplicate); polled ones are persisted anyway. A new front is started on
        the same port, at most :data:`FRONT_RESTARTS` times within :data:`FRONT_RESTART_WINDOW_S`
        (a new one that ends before it serves counts as one more end, and is started again too);
        past that, :meth:`poll` raises :class:`WebhookError` with the reason once the records held
        are handed over, which stops ingest (see :mod:`runtime.driver.webhook_link`)."""
        with self._lock:
            if self._server is not link:  # closed meanwhile (or a front started since)
                return
            dropped = [t for t in self._queue if t.link is link]
            for ticket in dropped:
                self._queue.remove(ticket)
                self._queued -= len(ticket.values)
            for ticket in self._inflight:  # persisted anyway, but nobody is told: never counted as answered
                if ticket.link is link:
                    ticket.withdrawn = True
            self._server = None
        link.release()
        while True:  # a new front that ends before it serves is one more end, and is started again too
            with self._lock:
                now = time.monotonic()
                self._front_deaths = [t for t in self._front_deaths if now - t < FRONT_RESTART_WINDOW_S] + [now]
                if len(self._front_deaths) > FRONT_RESTARTS:
                    self._front_lost = (f"{why}; it ended {len(self._front_deaths)} times within "
                                        f"{FRONT_RESTART_WINDOW_S:g} s, so it is not started again")
                    self._lock.notify_all()
                    log.error("webhook on port %d: %s", self.port, self._front_lost)
                    return
                if self._closed:
                    return
            log.error("webhook on port %d: %s; starting a new one on the same port", self.port, why)
            try:
                self._listen()
            except WebhookError as exc:  # it ended before serving (killed, crashed; its error is above)
                why = str(exc)
                continue
            except Exception as exc:  # the port, the socket pair, the interpreter: not a front's death
                with self._lock:
                    self._front_lost = f"{why}; starting a new one failed: {type(exc).__name__}: {exc}"
                    self._lock.notify_all()
                log.exception("webhook on port %d: %s", self.port, self._front_lost)
                return
            break
        with self._lock:  # close() came while the new front started: it must not outlive the source
            orphan, self._server = (self._server, None) if self._closed else (None, self._server)
        if orphan is not None:
            orphan.stop()

    def answered(self, status: int, records: int) -> None:
        with self._lock:
            self.answers[status] = self.answers.get(status, 0) + 1
            if status == 200:
                self.confirmed += records
            elif status == 503:
                self.refused += 1

    def readiness(self) -> str | None:
        """Why a request would not be taken now, or None (``GET /readyz``; see the module notes)."""
        with self._lock:
            if self._ending:
                return "the source is ending"
            if self._paused is not None:
                return f"ingest paused: {self._paused}"
            if self._last_poll is None:
                return "no ingest has polled this source yet"
            idle = time.monotonic() - self._last_poll
            if idle > STALE_POLL_S:
                return f"ingest has not polled this source for {idle:.0f} s"
            if self._queued >= self.max_queued:
                return f"{self._queued} records queued (max_queued {self.max_queued})"
        return None

    def health(self) -> dict[str, Any]:
        with self._lock:
            return {"queued": self._queued, "inflight": sum(t.remaining for t in self._inflight),
                    "confirmed": self.confirmed, "refused": self.refused, "paused": self._paused,
                    "ending": self._ending}

    # --- the source protocol (runtime.driver.ingest) ---------------------------------------------
    def open(self) -> None:
        """Listen again after :meth:`close` (a topology restarted); a front given up before (ended too
        often) gets its restarts anew: the ends before the close are not counted against the new one."""
        with self._lock:
            self._closed = False
            self._front_deaths = []
        self._listen()

    waits_when_idle = True  # poll() waits by itself: ingest polls again at once (runtime.driver.ingest)

    def poll(self) -> Iterable[Any] | None:
        """Records of waiting requests (up to ``chunk``, whole requests); None once :meth:`end` was
        called and every request taken was handed over; else [] at once while records handed over
        wait for their confirmation (an idle poll is what makes ingest persist its batch, and their
        clients wait for it), or [] if no request came within ``IDLE_POLL_S``. A request offered
        wakes ingest once the loop's turn that read it is over, so the requests read together are
        handed over together."""
        with self._lock:
            self._last_poll = time.monotonic()
            if not self._queue:
                if self._ending:
                    return None
                if self._front_lost is not None and not self._inflight:
                    raise WebhookError(self._front_lost)
                if self._inflight:
                    return []
                self._lock.wait(IDLE_POLL_S)
            out: list[Any] = []
            while self._queue and (not out or len(out) + len(self._queue[0].values) <= self.chunk):
                ticket = self._queue.popleft()
                self._queued -= len(ticket.values)
                self._inflight.append(ticket)
                out.extend(ticket.values)
            return out

    def ack(self, values: list[Any]) -> None:
        """Ingest's confirmation: ``values`` (the next ones in poll order) are safe; answer 2xx.
        Returns once the server's loop has answered the requests completed here, or after
        :data:`HANDOFF_S` (a busy or stopped loop answers them later; nothing waits longer)."""
        n = len(values)
        done: list[Ticket] = []
        with self._lock:
            while n and self._inflight:
                ticket = self._inflight[0]
                take = min(n, ticket.remaining)
                ticket.remaining -= take
                n -= take
                if ticket.remaining == 0:
                    done.append(self._inflight.popleft())
        if done:
            for ticket in done:
                if ticket.link is not None and not ticket.withdrawn:  # counted before the front answers
                    self.answered(200, len(ticket.values))
            settle_soon(done, True, HANDOFF_S)

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
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
            waiting = list(self._inflight) + list(self._queue)
            self._inflight.clear()
            self._queue.clear()
            self._queued = 0
        for ticket in waiting:
            if ticket.link is not None and not ticket.withdrawn:
                self.answered(503, len(ticket.values))
        settle_soon(waiting, False)  # answered 503 before the connections close
        if server is not None:
            server.stop()

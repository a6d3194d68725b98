"""Webhook clients that retry until confirmed: what a well-behaved producer does (tests and chaos).

:func:`post` sends one JSON record and returns the HTTP status (or None on a connection error).
:class:`RetryingClient` posts records from several threads and retries every non-2xx answer and
every connection error (waiting ``Retry-After`` when given) until the record is confirmed; its
``confirmed`` list is the ground truth a checker compares the sink with: every id in it must
arrive (see :mod:`runtime.driver.webhook` for why). :class:`BatchClient` does the same with
batches (JSON arrays and NDJSON) over keep-alive connections, as a production producer would.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit


def post(url: str, value: Any, timeout_s: float = 60.0) -> tuple[int | None, float | None]:
    """POST ``value`` as JSON; (status, Retry-After seconds or None), or (None, None) if the
    connection failed (refused, reset, timed out)."""
    parts = urlsplit(url)
    body = json.dumps(value).encode()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s)
    try:
        conn.request("POST", parts.path or "/", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        after = resp.getheader("Retry-After")
        return resp.status, float(after) if after else None
    except (OSError, http.client.HTTPException):
        return None, None
    finally:
        conn.close()


def _start_workers(target: Callable[[], None], name: str, count: int) -> list[threading.Thread]:
    """``count`` started daemon threads running ``target``, named ``<name>-<k>``."""
    workers = [threading.Thread(target=target, name=f"{name}-{k}", daemon=True) for k in range(count)]
    for w in workers:
        w.start()
    return workers


def _join_workers(workers: list[threading.Thread], timeout_s: float) -> bool:
    """Wait for every worker within ``timeout_s`` in all; True if none is still alive."""
    deadline = time.monotonic() + timeout_s
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    return all(not w.is_alive() for w in workers)


class RetryingClient:
    """Posts each record until a 2xx comes back, from ``threads`` threads.

    Counters: ``confirmed`` (ids, in confirmation order), ``answers`` (status -> count, None =
    connection error), ``retries`` (attempts beyond the first). ``pace_s``: each thread's pause
    after a confirmation (a steady producer rather than a flood). ``hold_at``: the threads take no
    record beyond the first ``hold_at`` until :meth:`release` (a harness that must fault the
    receiver before every record is in uses it, so a slow receiver cannot let the client finish
    first).
    """

    def __init__(
        self,
        url: str,
        records: Iterable[Any],
        *,
        threads: int = 4,
        id_of: Callable[[Any], int] = lambda v: int(v["i"]),
        backoff_s: float = 0.2,
        pace_s: float = 0.0,
        hold_at: int | None = None,
    ) -> None:
        self.url = url
        self._todo = list(records)
        self._next = 0
        self.threads = threads
        self.id_of = id_of
        self.backoff_s = backoff_s
        self.pace_s = pace_s  # each thread waits this long after a confirmation; read each time, so settable
        self.confirmed: list[int] = []
        self.answers: dict[int | None, int] = {}
        self.retries = 0
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._stop = threading.Event()
        self._hold_at = hold_at
        self._released = threading.Event()
        if hold_at is None:
            self._released.set()

    def release(self) -> None:
        """Let the threads take the records beyond ``hold_at``."""
        self._released.set()

    def _take(self) -> Any | None:
        while True:
            with self._lock:
                held = self._hold_at is not None and self._next >= self._hold_at and not self._released.is_set()
                if not held or self._stop.is_set():
                    if self._next >= len(self._todo):
                        return None
                    value = self._todo[self._next]
                    self._next += 1
                    return value
            self._released.wait(0.05)

    def _send(self, value: Any) -> None:
        attempt = 0
        while not self._stop.is_set():
            status, after = post(self.url, value)
            with self._lock:
                self.answers[status] = self.answers.get(status, 0) + 1
                if attempt:
                    self.retries += 1
            attempt += 1
            if status is not None and 200 <= status < 300:
                with self._lock:
                    self.confirmed.append(self.id_of(value))
                return
            if status is not None and 400 <= status < 500:
                msg = f"webhook refused record {self.id_of(value)} with {status}; not retrying"
                raise RuntimeError(msg)
            self._stop.wait(after if after is not None else self.backoff_s)

    def _run(self) -> None:
        while (value := self._take()) is not None and not self._stop.is_set():
            self._send(value)
            if self.pace_s:
                self._stop.wait(self.pace_s)

    def start(self) -> RetryingClient:
        self._workers = _start_workers(self._run, "webhook-client", self.threads)
        return self

    @property
    def done(self) -> bool:
        return all(not w.is_alive() for w in self._workers)

    def join(self, timeout_s: float) -> bool:
        """Wait until every record is confirmed; False on timeout. Releases a hold."""
        self.release()
        return _join_workers(self._workers, timeout_s)

    def stop(self) -> None:
        self._stop.set()


class BatchClient:
    """Posts records in batches over keep-alive connections, each batch until a 2xx comes back.

    ``connections`` threads each keep one HTTP/1.1 connection open across requests (a new one
    after a connection error or a ``Connection: close``) and take the next ``batch`` records in
    turn; every other batch goes as NDJSON (``application/x-ndjson``), the rest as a JSON array to
    ``<url>batch``. A batch is retried whole on any non-2xx answer (after ``Retry-After``) or
    connection error; a 4xx other than 429 stops the thread (a bug, not a fault). Counters:
    ``confirmed`` (ids), ``answers`` (status -> requests, None = connection error), ``retries``,
    ``requests``, ``connects`` (connections opened) and ``in_flight`` (requests sent, not answered).
    ``hold_at``: take no record beyond the first ``hold_at`` until :meth:`release`.
    """

    def __init__(self, url: str, records: Iterable[Any], *, connections: int = 4, batch: int = 50,
                 id_of: Callable[[Any], int] = lambda v: int(v["i"]), backoff_s: float = 0.2,
                 hold_at: int | None = None, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.path = (parts.path or "/").rstrip("/") + "/batch"
        self._todo = list(records)
        self._next = 0
        self.connections = connections
        self.batch = batch
        self.id_of = id_of
        self.backoff_s = backoff_s
        self.headers = headers or {}
        self.confirmed: list[int] = []
        self.answers: dict[int | None, int] = {}
        self.retries = self.requests = self.connects = self.in_flight = self.batches = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._hold_at = hold_at
        self._released = threading.Event()
        if hold_at is None:
            self._released.set()
        self._workers: list[threading.Thread] = []

    def release(self) -> None:
        self._released.set()

    def hold_at(self, hold_at: int) -> None:
        """Move the hold (before :meth:`release`): take the records up to ``hold_at``, then hold again."""
        with self._lock:
            self._hold_at = hold_at

    def _take(self) -> tuple[int, list[Any]] | None:
        while not self._stop.is_set():
            with self._lock:
                end = min(self._next + self.batch, len(self._todo))
                if self._hold_at is not None and not self._released.is_set():
                    end = min(end, self._hold_at)
                if self._next >= len(self._todo):
                    return None
                if end > self._next:
                    values = self._todo[self._next:end]
                    self._next = end
                    self.batches += 1
                    return self.batches, values
            self._released.wait(0.05)
        return None

    def _body(self, number: int, values: list[Any]) -> tuple[bytes, str]:
        if number % 2:
            return "".join(json.dumps(v) + "\n" for v in values).encode(), "application/x-ndjson"
        return json.dumps(values).encode(), "application/json"

    def _exchange(self, conn: http.client.HTTPConnection, body: bytes, content_type: str
                  ) -> tuple[int, float | None, bool]:
        conn.request("POST", self.path, body, {**self.headers, "Content-Type": content_type})
        resp = conn.getresponse()
        resp.read()
        after = resp.getheader("Retry-After")
        return resp.status, float(after) if after else None, resp.will_close

    def _run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        while (taken := self._take()) is not None:
            number, values = taken
            body, content_type = self._body(number, values)
            attempt = 0
            while not self._stop.is_set():
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                    with self._lock:
                        self.connects += 1
                with self._lock:
                    self.requests += 1
                    self.in_flight += 1
                    self.retries += 1 if attempt else 0
                try:
                    status, after, closing = self._exchange(conn, body, content_type)
                except (OSError, http.client.HTTPException):
                    status, after, closing = None, None, True
                with self._lock:
                    self.in_flight -= 1
                    self.answers[status] = self.answers.get(status, 0) + 1
                if closing:
                    conn.close()
                    conn = None
                attempt += 1
                if status is not None and 200 <= status < 300:
                    with self._lock:
                        self.confirmed.extend(self.id_of(v) for v in values)
                    break
                if status is not None and 400 <= status < 500 and status != 429:
                    with self._lock:
                        self.errors.append(f"batch {number} refused with {status}")
                    return
                self._stop.wait(after if after is not None else self.backoff_s)
        if conn is not None:
            conn.close()

    def start(self) -> BatchClient:
        self._workers = _start_workers(self._run, "webhook-batch", self.connections)
        return self

    @property
    def done(self) -> bool:
        return all(not w.is_alive() for w in self._workers)

    def join(self, timeout_s: float) -> bool:
        """Release a hold and wait until every batch is confirmed (or refused); False on timeout."""
        self.release()
        return _join_workers(self._workers, timeout_s) and not self.errors

    def stop(self) -> None:
        self._stop.set()

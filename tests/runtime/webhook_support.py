"""What the webhook tests share: a keep-alive HTTP client on http.client, and a receiver with ingest running."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ftlayer.facade.ft_layer import FTLayer
from runtime.driver.ingest import Ingestor
from runtime.driver.webhook import WebhookSource
from tests.waiting import wait_until


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    doc: Any

    @property
    def error(self) -> str:
        return str(self.doc.get("error", "")) if isinstance(self.doc, dict) else ""


class Http:
    """One HTTP/1.1 connection to the receiver, reused for every call (keep-alive)."""

    def __init__(self, url: str, *, context: ssl.SSLContext | None = None, timeout_s: float = 60.0) -> None:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        self.base = parts.path.rstrip("/")
        if parts.scheme == "https":
            self.conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, port, timeout=timeout_s,
                                                                                context=context)
        else:
            self.conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        self.sockets: set[int] = set()  # id() of every socket a call went out on

    def call(self, method: str, path: str, body: bytes | str | None = None,
             headers: dict[str, str] | None = None) -> Answer:
        data = body.encode() if isinstance(body, str) else body
        self.conn.request(method, self.base + "/" + path.lstrip("/"), data, headers or {})
        self.sockets.add(id(self.conn.sock))
        resp = self.conn.getresponse()
        raw = resp.read()
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = raw.decode(errors="replace")
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, doc)

    def post(self, path: str, value: Any, content_type: str = "application/json",
             headers: dict[str, str] | None = None) -> Answer:
        return self.call("POST", path, json.dumps(value), {"Content-Type": content_type, **(headers or {})})

    def close(self) -> None:
        self.conn.close()


def ndjson(values: list[Any]) -> str:
    return "".join(json.dumps(v) + "\n" for v in values)


@contextmanager
def receiving(layer: FTLayer, **kw: Any) -> Iterator[tuple[WebhookSource, Ingestor]]:
    """A receiver with ingest running into ``layer``, ready (ingest polled it); ended and stopped afterwards."""
    kw.setdefault("reply_timeout_s", 10.0)
    hooks = WebhookSource(**kw)
    ing = Ingestor(layer, hooks).start()
    try:
        wait_until(lambda: hooks.readiness() is None, 10, "ingest to poll the receiver")
        yield hooks, ing
    finally:
        hooks.end()
        deadline = time.monotonic() + 30  # ingest held by backpressure never ends by itself: stop() then
        while not ing.done and time.monotonic() < deadline and ing.paused is None:
            time.sleep(0.02)
        ing.stop()

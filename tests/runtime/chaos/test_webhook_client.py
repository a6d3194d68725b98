"""The chaos webhook client's hold: no record beyond ``hold_at`` is sent until released."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from runtime.chaos.webhook_client import RetryingClient


class _Ok(BaseHTTPRequestHandler):
    seen: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append(json.loads(body)["i"])
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def url() -> Iterator[str]:
    _Ok.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_hold_stops_at_hold_at_until_released(url: str) -> None:
    client = RetryingClient(url, [{"i": i} for i in range(30)], threads=4, hold_at=10).start()
    deadline = time.monotonic() + 30
    while len(client.confirmed) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # a client that ignored the hold would have sent more by now
    assert sorted(client.confirmed) == list(range(10))
    assert not client.done
    assert client.join(30)
    assert sorted(client.confirmed) == list(range(30))
    assert sorted(_Ok.seen) == list(range(30))

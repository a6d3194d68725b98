"""Load generators of the receiver benchmark, each run as a process of its own (``python -m runtime.bench.load``).

Protocol with the benchmark: the process connects, prints ``ready``, waits for one line on stdin
(``go``), sends its load, and prints one JSON line with what it did (``elapsed_s`` from ``go`` to
the last confirmation; the HTTP load also its own ``cpu_s`` over that time). Running apart keeps
the client's CPU out of the measured process's GIL.

- ``http URL --records N --batch B --connections C``: ``C`` keep-alive HTTP/1.1 connections, each
  posting JSON-array bodies of ``B`` records to ``URL``batch, one request at a time, until ``N``
  records are answered 200 (a 503 is sent again after its Retry-After). A minimal client of its own
  (:class:`_Poster`: pre-built request bytes, answers parsed for their status and length only):
  aiohttp's client took about 400 us of CPU a request on the 2-core VM, as much as the server
  under test, which left the servers one core between them.
- ``mqtt URL --records N --topic T``: paho-mqtt, QoS 1, ``N`` JSON messages to topic ``T/<k % 37>``,
  until the broker acknowledged every one (PUBACK); at most 20 unacknowledged (Mosquitto's
  Receive Maximum for a client).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any


def _go() -> float:
    print("ready", flush=True)
    sys.stdin.readline()
    return time.perf_counter()


def load_body(batch: int) -> bytes:
    """The JSON array every request of the HTTP load posts (the ingest-alone figure polls the same records)."""
    return json.dumps([{"i": i, "user": f"u{i % 37}", "v": i * 7} for i in range(batch)]).encode()


class _Poster(asyncio.Protocol):
    """One keep-alive connection posting the same pre-built request until the shared budget of
    requests is spent: a request goes out when the previous answer is in (a 503 is sent again after
    its Retry-After). Parses only what it needs of an answer (status, Content-Length, Retry-After),
    so the load costs a few tens of microseconds a request, not an HTTP client's hundreds: the CPU
    it leaves is the servers' to use, on this machine's 2 cores."""

    def __init__(self, request: bytes, budget: list[int], statuses: dict[int, int], done: asyncio.Future[None],
                 connected: asyncio.Future[None]) -> None:
        self.request = request
        self.budget = budget  # [requests not yet answered 200 and not yet taken by a connection]
        self.statuses = statuses
        self.done = done
        self.connected = connected
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.outstanding = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.connected.set_result(None)

    def start(self) -> None:
        if self.budget[0] > 0:
            self.budget[0] -= 1
            self.outstanding = True
            assert self.transport is not None
            self.transport.write(self.request)
        else:
            self._finished()

    def _finished(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1").split("\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
            total = end + 4 + int(fields.get("content-length", "0"))
            if len(self.buffer) < total:
                return
            self.buffer = self.buffer[total:]
            status = int(head[0].split(" ", 2)[1])
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == 200:
                self.outstanding = False
                self.start()
            else:  # sent again (the budget already counts it) after the server's Retry-After
                delay = float(fields.get("retry-after", "0.1"))
                asyncio.get_running_loop().call_later(delay, self._again)

    def _again(self) -> None:
        assert self.transport is not None
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.outstanding and not self.done.done():
            self.done.set_exception(ConnectionError(f"the server closed a connection with a request unanswered: {exc}"))


async def http_load(url: str, records: int, batch: int, connections: int) -> dict[str, Any]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = load_body(batch)
    path = parts.path.rstrip("/") + "/batch"
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    requests = -(-records // batch)
    budget = [requests]
    statuses: dict[int, int] = {}
    loop = asyncio.get_running_loop()
    posters: list[_Poster] = []
    dones: list[asyncio.Future[None]] = []
    for _ in range(connections):  # every connection open before the clock starts
        done, connected = loop.create_future(), loop.create_future()
        poster = _Poster(request, budget, statuses, done, connected)
        await loop.create_connection(lambda p=poster: p, host, port)  # type: ignore[misc]
        await connected
        posters.append(poster)
        dones.append(done)
    started = await loop.run_in_executor(None, _go)
    cpu_started = time.process_time()
    for poster in posters:
        poster.start()
    await asyncio.gather(*dones)
    elapsed = time.perf_counter() - started
    return {"records": requests * batch, "requests": requests, "elapsed_s": elapsed, "statuses": statuses,
            "cpu_s": time.process_time() - cpu_started}


def mqtt_load(url: str, records: int, topic: str) -> dict[str, Any]:
    from paho.mqtt.enums import CallbackAPIVersion

    from runtime.driver.mqtt_client import BrokerAddress, paho

    mqtt = paho()
    address = BrokerAddress.parse(url)
    acked = threading.Semaphore(0)
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-pub-{topic}", protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(20)
    client.max_queued_messages_set(0)
    client.on_publish = lambda _c, _u, _mid, _reason, _p: acked.release()
    client.connect(address.host, address.port, keepalive=30)
    client.loop_start()
    payloads = [json.dumps({"i": i, "user": f"u{i % 37}", "v": i * 7}) for i in range(records)]
    started = _go()
    for i, payload in enumerate(payloads):
        client.publish(f"{topic}/{i % 37}", payload, qos=1)
    for _ in range(records):
        acked.acquire()
    elapsed = time.perf_counter() - started
    client.disconnect()
    client.loop_stop()
    return {"records": records, "elapsed_s": elapsed}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.bench.load")
    p.add_argument("kind", choices=("http", "mqtt"))
    p.add_argument("url")
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--topic", default="bench")
    args = p.parse_args(argv)
    if args.kind == "http":
        result = asyncio.run(http_load(args.url, args.records, args.batch, args.connections))
    else:
        result = mqtt_load(args.url, args.records, args.topic)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

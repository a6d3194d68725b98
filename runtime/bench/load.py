"""Load generators of the receiver benchmark, each run as a process of its own (``python -m runtime.bench.load``).

Protocol with the benchmark: the process connects, prints ``ready``, waits for one line on stdin
(``go``), sends its load, and prints one JSON line with what it did (``elapsed_s`` from ``go`` to
the last confirmation). Running apart keeps the client's CPU out of the measured process's GIL.

- ``http URL --records N --batch B --connections C``: aiohttp's client, ``C`` keep-alive connections,
  each posting JSON-array bodies of ``B`` records to ``URL``batch until ``N`` records are answered
  200 (a 503 is retried after its Retry-After).
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


async def http_load(url: str, records: int, batch: int, connections: int) -> dict[str, Any]:
    import aiohttp

    body = load_body(batch)
    target = url.rstrip("/") + "/batch"
    requests = -(-records // batch)
    statuses: dict[int, int] = {}
    todo = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"}) as session:
        # open every connection before the clock starts
        await asyncio.gather(*(session.get(url.rstrip("/") + "/healthz") for _ in range(connections)))

        async def worker() -> None:
            for _ in todo:
                while True:
                    async with session.post(target, data=body) as resp:
                        await resp.read()
                        statuses[resp.status] = statuses.get(resp.status, 0) + 1
                        if resp.status == 200:
                            break
                        await asyncio.sleep(float(resp.headers.get("Retry-After", "0.1")))

        started = await asyncio.get_running_loop().run_in_executor(None, _go)
        await asyncio.gather(*(worker() for _ in range(connections)))
        elapsed = time.perf_counter() - started
    return {"records": requests * batch, "requests": requests, "elapsed_s": elapsed, "statuses": statuses}


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

"""The receiver benchmarks (``scripts/bench webhook mqtt``): records/s through ftlayer's receivers next to the
raw rate of the same server or broker without ftlayer, measured side by side in one run (alternating rounds).

- **webhook**: the load process (:mod:`runtime.bench.load`: a minimal HTTP/1.1 client of its own, so
  that the load leaves the CPU to the servers) posts JSON-array bodies of ``batch`` records on
  ``connections`` keep-alive connections. *raw*: the same aiohttp server code
  (:class:`~runtime.driver.webhook_http.HttpServer`: routing, body parsing, the JSON answer) in a
  thread of this process, whose intake confirms every request at once: no ingest, no Redis.
  *ftlayer*: a :class:`~runtime.driver.webhook.WebhookSource` as users get it (its HTTP front in a
  process of its own, :mod:`runtime.driver.webhook_link`) with an
  :class:`~runtime.driver.ingest.Ingestor` persisting into Redis; a request is answered 200 once
  its records are persisted. The figure is records / time from ``go`` to the last 200. *ingest
  alone*: the same records handed to an Ingestor by a plain poll source, no HTTP, persisted in
  batches of ``batch`` x ``connections`` records (the most the load ever has in flight, so the
  largest batch the receiver can persist at once): the ceiling ingest's own work (packing, key
  hash, chunk encoding, the persist call) puts on the receiver under this load.
- **mqtt**: two load processes publish ``records`` JSON messages at QoS 1 to one Mosquitto
  (persistence on, saved every 10,000 changes, no per-message log). *raw*: a paho-mqtt subscriber at
  QoS 1 (receive maximum 1000, acknowledging on receipt) counts them. *ftlayer*: an
  :class:`~runtime.driver.mqtt.MqttSource` with an Ingestor persisting into Redis, acknowledging each
  message after persist. The figure is records / time from ``go`` to the last record received (raw)
  or persisted (ftlayer).

The webhook figures also say where the CPU goes (``cpu_us_per_request``: CPU microseconds per request
of the raw server's HTTP thread; of ftlayer's front process, link thread and ingest thread; of the
Redis server while the round ran; and of each round's load client). The receiver's rate is bound by
its ingest process: the link and ingest threads share one GIL, so their CPU per request against the
raw server's HTTP thread is what the ratio mostly reflects.

Each ``*_vs_raw_ratio`` is ftlayer's rate over the raw rate of the same round; summaries are the
median, min and max over rounds. Nothing reads the persisted records (no Spark): it measures the
receiver and ingest, whose records pile up pending (``max_pending`` raised) and are deleted with the
round's namespace.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.bench.common import delete_namespace, summary
from runtime.bench.load import load_body

Say = Callable[[str], None]


def _load(kind: str, url: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "runtime.bench.load", kind, url, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        msg = f"bench load process ({kind}) did not start: {line!r}"
        raise RuntimeError(msg)
    return proc


def _go(procs: list[subprocess.Popen[str]]) -> float:
    started = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return started


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        msg = f"bench load process failed with exit {proc.returncode}: {out[-500:]}"
        raise RuntimeError(msg)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# --- webhook -----------------------------------------------------------------------------------
class _Confirmed:
    """A future already resolved: the raw server's "ticket"."""

    def __init__(self, values: list[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.values = values
        self.future: asyncio.Future[bool | None] = loop.create_future()
        self.future.set_result(True)


class _EchoIntake:
    """The raw variant's intake: every request is confirmed at once (no ingest, no Redis)."""

    reply_timeout_s = 30.0
    retry_after_s = 1

    def offer(self, values: list[Any], loop: asyncio.AbstractEventLoop) -> _Confirmed:
        return _Confirmed(values, loop)

    def withdraw(self, ticket: Any) -> None:
        return None

    def answered(self, status: int, records: int) -> None:
        return None

    def readiness(self) -> str | None:
        return None

    def health(self) -> dict[str, Any]:
        return {}


HTTP_THREAD = "ftlayer-webhook"  # runtime.driver.webhook_http.HttpServer's event loop (the raw server's)
INGEST_THREAD = "ftlayer-ingest"  # runtime.driver.ingest.Ingestor.start
LINK_THREAD = "ftlayer-webhook-link"  # runtime.driver.webhook_link.FrontLink's reader


def _thread_cpu_s(name: str) -> float | None:
    """CPU seconds used so far by this process's live threads named ``name`` (their POSIX CPU clocks);
    None when there is no such thread."""
    clocks = [time.clock_gettime(time.pthread_getcpuclockid(thread.ident)) for thread in threading.enumerate()
              if thread.name == name and thread.ident is not None]
    return sum(clocks) if clocks else None


def _process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (from /proc; 0 where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu_s(client: Any) -> float:
    """CPU seconds the Redis server has used (user + system, from INFO cpu)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _webhook_round(variant: str, url: str, records: int, batch: int, connections: int, *,
                   cpu: dict[str, list[float]] | None = None, redis_client: Any = None,
                   front_pid: int | None = None) -> float:
    """records/s of one round against a server listening on ``url``; with ``cpu``, appends the CPU
    microseconds per request of each part that exists (the HTTP thread or the front process, the
    ingest and link threads, the Redis server, the load client) over the round."""
    threads = {f"{variant}_http_thread": HTTP_THREAD, f"{variant}_ingest_thread": INGEST_THREAD,
               f"{variant}_link_thread": LINK_THREAD}
    before = {key: _thread_cpu_s(name) for key, name in threads.items()}  # None: no such part in this variant
    front_before = _process_cpu_s(front_pid) if front_pid is not None else 0.0
    server_before = _server_cpu_s(redis_client) if redis_client is not None else 0.0
    proc = _load("http", url, "--records", str(records), "--batch", str(batch), "--connections", str(connections))
    _go([proc])
    result = _result(proc)
    if cpu is not None:
        requests = -(-records // batch)
        used: dict[str, float] = {}
        for key, name in threads.items():
            start, end = before[key], _thread_cpu_s(name)
            if start is not None and end is not None:
                used[key] = end - start
        if front_pid is not None:  # /proc's clock ticks: 10 ms steps, so a tiny round may read 0
            used[f"{variant}_front_process"] = _process_cpu_s(front_pid) - front_before
        if redis_client is not None:
            used["redis_server"] = _server_cpu_s(redis_client) - server_before
        used[f"{variant}_load_client"] = float(result["cpu_s"])
        for key, seconds in used.items():
            cpu.setdefault(key, []).append(seconds / requests * 1e6)
    if set(result["statuses"]) != {"200"}:  # JSON keys are strings
        msg = f"webhook bench ({variant}): answers other than 200: {result['statuses']}"
        raise RuntimeError(msg)
    return float(result["records"]) / float(result["elapsed_s"])


def _raw_webhook(records: int, batch: int, connections: int, cpu: dict[str, list[float]] | None = None) -> float:
    import socket

    from runtime.driver.webhook_body import WebhookAuth
    from runtime.driver.webhook_http import HttpServer

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    server = HttpServer(_EchoIntake(), sock, path="/", auth=WebhookAuth(), max_body_bytes=1 << 24, ssl_context=None)
    try:
        return _webhook_round("raw", f"http://127.0.0.1:{sock.getsockname()[1]}/", records, batch, connections,
                              cpu=cpu)
    finally:
        server.stop()


def _ftlayer_webhook(url: str, records: int, batch: int, connections: int,
                     cpu: dict[str, list[float]] | None = None) -> float:
    from runtime.driver.ingest import Ingestor
    from runtime.driver.webhook import WebhookSource

    namespace = "benchwh" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, max_pending=records * 4)
    layer = FTLayer(cfg, "bench", "webhook", num_channels=2).open()
    hooks = WebhookSource(max_body_bytes=1 << 24, max_queued=max(10_000, 4 * batch * connections))
    ingestor = Ingestor(layer, hooks, key=lambda v: v["user"]).start()
    try:
        while hooks.readiness() is not None:
            time.sleep(0.01)
        rate = _webhook_round("ftlayer", hooks.url, records, batch, connections, cpu=cpu, redis_client=layer.client,
                              front_pid=hooks.front_pid)
        if layer.stats()["persisted"] < records:
            msg = f"webhook bench: {layer.stats()['persisted']} of {records} records persisted after every 200"
            raise RuntimeError(msg)
        return rate
    finally:
        hooks.end()
        ingestor.stop(30)
        hooks.close()
        delete_namespace(url, namespace)


class _Batches:
    """A poll source handing out the load's records ``size`` at a time, each followed by an idle poll
    (so ingest persists every ``size`` records, as the receiver does after a burst of requests)."""

    waits_when_idle = True  # no linger sleep after the idle poll (as the webhook source)

    def __init__(self, records: int, size: int) -> None:
        body = json.loads(load_body(size))
        self.polls: list[list[Any]] = [[], body] * -(-records // size)

    def poll(self) -> list[Any] | None:
        return self.polls.pop() if self.polls else None


def _ingest_only(url: str, records: int, batch: int, connections: int) -> float:
    """records/s of ingest alone on the same records, persisted ``batch`` x ``connections`` at a time
    (see the module notes)."""
    from runtime.driver.ingest import Ingestor

    namespace = "benchin" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, max_pending=records * 4)
    layer = FTLayer(cfg, "bench", "ingest", num_channels=2).open()
    source = _Batches(records, batch * connections)
    try:
        started = time.perf_counter()
        Ingestor(layer, source, key=lambda v: v["user"]).run()
        return layer.stats()["persisted"] / (time.perf_counter() - started)
    finally:
        delete_namespace(url, namespace)


def bench_webhook(url: str, records: int, batch: int, connections: int, repeats: int, *,
                  progress: Say = lambda _m: None) -> dict[str, Any]:
    """Alternating rounds of raw and ftlayer (see the module notes)."""
    raw: list[float] = []
    ft: list[float] = []
    alone: list[float] = []
    cpu: dict[str, list[float]] = {}  # CPU microseconds per request, by part (see the module notes)
    _raw_webhook(min(records, 20 * batch), batch, connections)  # warm-up: imports, first connections
    for r in range(repeats):
        raw.append(_raw_webhook(records, batch, connections, cpu))
        ft.append(_ftlayer_webhook(url, records, batch, connections, cpu))
        alone.append(_ingest_only(url, records, batch, connections))
        parts = ", ".join(f"{key} {values[-1]:,.0f}" for key, values in cpu.items())
        progress(f"  webhook round {r + 1}: raw {raw[-1]:,.0f}/s, ftlayer {ft[-1]:,.0f}/s "
                 f"(ingest alone, no HTTP: {alone[-1]:,.0f}/s); CPU us per request: {parts}")
    return {"records": records, "batch": batch, "connections": connections, "repeats": repeats,
            "raw_records_per_s": summary(raw), "ftlayer_records_per_s": summary(ft),
            "ingest_only_records_per_s": summary(alone),
            "cpu_us_per_request": {key: summary(values) for key, values in cpu.items()},
            "webhook_vs_raw_ratio": summary([f / r for f, r in zip(ft, raw, strict=True)]),
            "webhook_vs_ingest_only_ratio": summary([f / a for f, a in zip(ft, alone, strict=True)])}


# --- MQTT --------------------------------------------------------------------------------------
PUBLISHERS = 2


def _publish(broker_url: str, records: int, topic: str) -> tuple[list[subprocess.Popen[str]], float]:
    share = -(-records // PUBLISHERS)
    procs = [_load("mqtt", broker_url, "--records", str(share), "--topic", f"{topic}/p{k}") for k in range(PUBLISHERS)]
    return procs, _go(procs)


def _raw_mqtt(broker_url: str, records: int, topic: str) -> float:
    from paho.mqtt.enums import CallbackAPIVersion

    from runtime.driver.mqtt_client import BrokerAddress, paho

    mqtt = paho()
    address = BrokerAddress.parse(broker_url)
    done = threading.Event()
    count = [0, 0.0]
    total = PUBLISHERS * -(-records // PUBLISHERS)

    def on_message(_c: Any, _u: Any, _m: Any) -> None:
        count[0] += 1
        if count[0] >= total:
            count[1] = time.perf_counter()
            done.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-raw-{topic}", protocol=mqtt.MQTTv5)
    client.max_inflight_messages_set(1000)
    client.on_message = on_message
    subscribed = threading.Event()
    client.on_subscribe = lambda *_a: subscribed.set()
    client.connect(address.host, address.port, keepalive=30)
    client.loop_start()
    client.subscribe(f"{topic}/#", qos=1)
    subscribed.wait(30)
    try:
        procs, started = _publish(broker_url, records, topic)
        if not done.wait(600):
            msg = f"mqtt bench (raw): {count[0]} of {total} messages received"
            raise RuntimeError(msg)
        for proc in procs:
            _result(proc)
        return total / (count[1] - started)
    finally:
        client.disconnect()
        client.loop_stop()


def _ftlayer_mqtt(url: str, broker_url: str, records: int, topic: str) -> float:
    from runtime.driver.ingest import Ingestor
    from runtime.driver.mqtt import MqttSource

    namespace = "benchmq" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, max_pending=records * 4)
    layer = FTLayer(cfg, "bench", "mqtt", num_channels=2).open()
    source = MqttSource(broker_url, f"{topic}/#", client_id=f"bench-ft-{topic}", qos=1)
    source.open()
    ingestor = Ingestor(layer, source, key=lambda v: v["user"]).start()
    total = PUBLISHERS * -(-records // PUBLISHERS)
    try:
        procs, started = _publish(broker_url, records, topic)
        deadline = time.monotonic() + 600
        while ingestor.ingested < total:
            if time.monotonic() > deadline or ingestor.error is not None:
                msg = f"mqtt bench (ftlayer): {ingestor.ingested} of {total} persisted ({ingestor.error})"
                raise RuntimeError(msg)
            time.sleep(0.001)
        finished = time.perf_counter()
        for proc in procs:
            _result(proc)
        return total / (finished - started)
    finally:
        source.end()
        ingestor.stop(30)
        source.close()
        delete_namespace(url, namespace)


def bench_mqtt(url: str, records: int, repeats: int, *, progress: Say = lambda _m: None) -> dict[str, Any]:
    """Alternating rounds of raw and ftlayer on one broker (see the module notes)."""
    from runtime.driver.mosquitto import EmbeddedMosquitto

    raw: list[float] = []
    ft: list[float] = []
    with EmbeddedMosquitto(autosave_changes=10_000, verbose=False) as broker:
        _raw_mqtt(broker.url, min(records, 2000), "warmup")
        for r in range(repeats):
            raw.append(_raw_mqtt(broker.url, records, f"raw{r}"))
            ft.append(_ftlayer_mqtt(url, broker.url, records, f"ft{r}"))
            progress(f"  mqtt round {r + 1}: raw {raw[-1]:,.0f}/s, ftlayer {ft[-1]:,.0f}/s")
    return {"records": records, "publishers": PUBLISHERS, "qos": 1, "repeats": repeats,
            "raw_records_per_s": summary(raw), "ftlayer_records_per_s": summary(ft),
            "mqtt_vs_raw_ratio": summary([f / r for f, r in zip(ft, raw, strict=True)])}

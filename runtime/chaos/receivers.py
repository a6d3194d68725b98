"""Chaos for the receivers run as processes of their own (issue 28 item 5): kill -9 of ``ftlayer ingest
--mqtt``, of the Mosquitto broker, and of ``ftlayer ingest --webhook`` under keep-alive batched clients.

Every scenario starts its own Redis (``<workdir>/redis``, ``appendfsync always``, so it may freeze
it with SIGSTOP) and a DataFrame query in this process that reads the chaos source while the ingest
processes write it (:class:`~runtime.chaos.ingest_cli.Consumer`). The checker's produced ids are
the producer's confirmed ones: what the broker acknowledged to the publisher (PUBACK), or the
batches the webhook answered 2xx. Every one must reach the sink (lost 0); duplicates (a message
or a batch persisted whose confirmation died with the process) are counted, not failed.

- ``mqtt-ingest-kill``: a QoS 1 publisher publishes a third and holds; once that third is persisted,
  Redis is frozen, the publisher sends the next third (ingest receives it and cannot persist it:
  messages in hand at the kill, whatever the number of records) and, 0.3 s after the broker
  acknowledged it, the ingest process is SIGKILLed, then started again with the same
  ``--client-id``: the broker resends what was never acknowledged.
- ``mqtt-broker-kill``: Redis frozen while ingest holds unpersisted messages, Mosquitto SIGKILLed
  and restarted on its data directory; ingest persists what it holds once Redis answers, withholds
  the acknowledgements owed on the dead connection, and reconnects. The publisher pauses 0.5 s
  before the kill: Mosquitto acknowledges a message before its own save, a loss of the broker's
  that no subscriber can prevent (docs/sources.md).
- ``webhook-keepalive``: ``connections`` clients post batches of ``batch`` records (JSON arrays and
  NDJSON; smaller batches for a small ``records``) on keep-alive connections; once the first third
  is confirmed, Redis is frozen and the clients take the next third, so every connection has a
  request in flight; 0.3 s later the ingest process is SIGKILLed, then started again on the same
  port. The clients retry every connection error and 503 until their batches are confirmed.
- ``webhook-front-kill``: the same, but what is SIGKILLed is the receiver's HTTP front process
  (:mod:`runtime.driver.webhook_link`); the ingest process lives on, persists what it took once
  Redis answers, and starts a new front on the same port, which the clients' retries reach.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from ftlayer.servers.embedded import EmbeddedServer
from ftlayer.servers.ports import free_port
from runtime.chaos.base import SOURCE, TOPOLOGY, ScenarioContext
from runtime.chaos.errors import ChaosError
from runtime.chaos.front import front_pid
from runtime.chaos.ingest_cli import Consumer, IngestProcess
from runtime.checker import Report, check
from runtime.testing import default_value

MQTT_CLIENT = "ftlayer-chaos-ingest"


@contextlib.contextmanager
def _stage(ctx: ScenarioContext) -> Iterator[tuple[EmbeddedServer, Consumer]]:
    """The scenario's own Redis and the query that drains the source; both stopped afterwards."""
    server = EmbeddedServer(data_dir=ctx.workdir / "redis", appendfsync="always").start()
    try:
        ctx.config = ctx.config.replace(redis_url=server.url, timeout_s=60.0)
        consumer = Consumer(ctx)
        try:
            yield server, consumer
        finally:
            consumer.stop()
    finally:
        server.stop()


@contextlib.contextmanager
def _frozen(server: EmbeddedServer) -> Iterator[None]:
    os.kill(server.pid or 0, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid or 0, signal.SIGCONT)


def _wait(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            msg = f"timed out waiting for {what} ({timeout_s:g} s)"
            raise ChaosError(msg)
        time.sleep(0.02)


def _report(ctx: ScenarioContext, consumer: Consumer, confirmed: list[int], records: int) -> Report:
    """The checker's report (the query stopped first, the scenario's server still up)."""
    consumer.stop()
    report = check([ctx.layer(ctx.config.replace(num_channels=2))], consumer.lines, confirmed,
                   ctx.faults, strict=ctx.strict, scenario=ctx.name)
    report.expect(f"the producer got every record confirmed ({len(set(confirmed))}/{records})",
                  set(confirmed) == set(range(records)))
    report.notes.extend(ctx.notes)
    report.elapsed_s = time.monotonic() - ctx.started
    return report


# --- MQTT --------------------------------------------------------------------------------------
def _count(broker: Any, pattern: str) -> int:
    return sum(1 for line in broker.log_lines() if re.search(pattern, line))


def _unacked(broker: Any, qos: int = 1) -> int:
    ack = "PUBACK" if qos == 1 else "PUBREC"
    sent = _count(broker, rf"Sending PUBLISH to {MQTT_CLIENT} ")
    return sent - _count(broker, rf"Received {ack} from {MQTT_CLIENT} ")


def _mqtt_ingest(ctx: ScenarioContext, broker_url: str, qos: int) -> IngestProcess:
    proc = IngestProcess(TOPOLOGY, SOURCE, "--mqtt", broker_url, "--topic", "sensors/#", "--client-id", MQTT_CLIENT,
                         "--qos", str(qos), "--key", "user", redis_url=ctx.config.redis_url,
                         namespace=ctx.config.namespace)
    proc.wait_for("subscribed to")
    return proc


def _finish_mqtt(ctx: ScenarioContext, consumer: Consumer, ingest: IngestProcess, publisher: Any, *, broker: Any,
                 records: int) -> tuple[Report, str]:
    try:
        joined = publisher.join(300)
    finally:
        publisher.stop()
    consumer.drain(publisher.confirmed)
    rc, out = ingest.stop()
    resent = _count(broker, rf"Sending PUBLISH to {MQTT_CLIENT} \(d1")
    ctx.notes.append(f"broker resent {resent} messages (DUP) to the restarted process; ingest: "
                     f"{out.strip().splitlines()[-1] if out.strip() else ''}")
    report = _report(ctx, consumer, sorted(set(publisher.confirmed)), records)
    report.expect("the publisher finished", joined)
    report.expect(f"the last ingest process exited 0 (exit {rc})", rc == 0)
    return report, out


def mqtt_ingest_kill(ctx: ScenarioContext, records: int, qos: int = 1) -> Report:
    """SIGKILL ``ftlayer ingest --mqtt`` mid-stream with messages in hand; restart it (see the module notes)."""
    from runtime.chaos.mqtt_publisher import Publisher
    from runtime.driver.mosquitto import EmbeddedMosquitto

    with _stage(ctx) as (server, consumer), EmbeddedMosquitto(ctx.workdir / "mosquitto") as broker:
        layer = ctx.layer(ctx.config.replace(num_channels=2))
        first = _mqtt_ingest(ctx, broker.url, qos)
        third, two_thirds = records // 3, 2 * records // 3
        publisher = Publisher(broker.url, [default_value(i) for i in range(records)], qos=qos,
                              hold_at=third, client_id="ftlayer-chaos-publisher").start()
        try:
            _wait(lambda: layer.stats()["persisted"] >= third, 120, "a third of the records persisted")
            with _frozen(server):  # the next third goes out now: ingest receives it and cannot persist it
                publisher.hold_at(two_thirds)
                _wait(lambda: len(publisher.confirmed) >= two_thirds, 120, "two thirds published")
                time.sleep(0.3)  # the broker hands them on: messages in hand at the kill, at any --records
                in_flight = _unacked(broker, qos)
                first.kill9()
            at_kill = len(publisher.confirmed)
            ctx.say(f"ingest SIGKILLed with {in_flight} messages unacknowledged, {at_kill}/{records} published")
            ctx.notes.append(f"ingest killed with {in_flight} messages received and unacknowledged, {at_kill} of "
                             f"{records} acknowledged to the publisher")
            second = _mqtt_ingest(ctx, broker.url, qos)
        except BaseException:
            publisher.stop()
            raise
        report, _out = _finish_mqtt(ctx, consumer, second, publisher, broker=broker, records=records)
    report.expect(f"killed mid-stream ({at_kill}/{records} published) with messages in hand ({in_flight})",
                  at_kill < records and in_flight > 0)
    return report


def mqtt_broker_kill(ctx: ScenarioContext, records: int) -> Report:
    """SIGKILL Mosquitto while ingest holds unpersisted messages; restart it on its data (see the module notes)."""
    from runtime.chaos.mqtt_publisher import Publisher
    from runtime.driver.mosquitto import EmbeddedMosquitto

    hold = 2 * records // 3
    with _stage(ctx) as (server, consumer), EmbeddedMosquitto(ctx.workdir / "mosquitto") as broker:
        ingest = _mqtt_ingest(ctx, broker.url, 1)
        publisher = Publisher(broker.url, [default_value(i) for i in range(records)], hold_at=hold,
                              client_id="ftlayer-chaos-publisher").start()
        try:
            _wait(lambda: len(publisher.confirmed) >= records // 5, 120, "a fifth acknowledged to the publisher")
            with _frozen(server):
                _wait(lambda: len(publisher.confirmed) == hold, 120, "the publisher to reach its hold")
                time.sleep(0.5)  # quiet: the broker saved its database after the last change
                held = _unacked(broker)
                broker.kill9()
                # Redis answers only once ingest has seen the connection die (an ack released before
                # its network thread notices goes into the dead socket, counted as sent, not withheld)
                ingest.wait_for("connection lost", 60)
            ctx.say(f"broker SIGKILLed with {held} messages sent to ingest and unacknowledged; restarting it")
            time.sleep(1.0)
            broker.restart()
            publisher.release()
        except BaseException:
            publisher.stop()
            raise
        report, out = _finish_mqtt(ctx, consumer, ingest, publisher, broker=broker, records=records)
    stale = re.search(r"left to the broker (\d+)", out)
    withheld = int(stale.group(1)) if stale else 0
    report.notes.append(f"broker killed with {held} messages unacknowledged; ingest withheld {withheld} "
                        "acknowledgements owed on the dead connection")
    report.expect(f"ingest held messages when the broker died ({withheld} acknowledgements withheld)", withheld > 0)
    return report


# --- webhook -----------------------------------------------------------------------------------
def _webhook_ingest(ctx: ScenarioContext, port: int) -> IngestProcess:
    proc = IngestProcess(TOPOLOGY, SOURCE, "--webhook", f"127.0.0.1:{port}", "--key", "user",
                         redis_url=ctx.config.redis_url, namespace=ctx.config.namespace)
    proc.wait_for("listening on")
    return proc


def webhook_keepalive(ctx: ScenarioContext, records: int, connections: int = 4, batch: int = 25) -> Report:
    """SIGKILL ``ftlayer ingest --webhook`` under keep-alive batched clients; restart it on the same port."""
    return _webhook_kill(ctx, records, connections, batch, kill="ingest")


def webhook_front_kill(ctx: ScenarioContext, records: int, connections: int = 4, batch: int = 25) -> Report:
    """SIGKILL the HTTP front process of ``ftlayer ingest --webhook`` under keep-alive batched clients; the
    ingest process starts a new one on the same port."""
    return _webhook_kill(ctx, records, connections, batch, kill="front")


def _webhook_kill(ctx: ScenarioContext, records: int, connections: int, batch: int, *, kill: str) -> Report:
    from runtime.chaos.webhook_client import BatchClient

    # smaller batches for a small --records: each third still takes several requests per connection
    batch = max(1, min(batch, records // (16 * connections)))
    third, two_thirds = records // 3, 2 * records // 3
    with _stage(ctx) as (server, consumer):
        port = free_port()
        first = _webhook_ingest(ctx, port)
        front = front_pid(first.proc.pid)
        client = BatchClient(f"http://127.0.0.1:{port}/", [default_value(i) for i in range(records)],
                             connections=connections, batch=batch, hold_at=third).start()
        try:
            _wait(lambda: len(client.confirmed) >= third, 120, "a third of the records confirmed")
            with _frozen(server):  # the next third goes out now: ingest takes it and cannot persist it
                client.hold_at(two_thirds)
                _wait(lambda: client.in_flight == connections, 10, "a request in flight on every connection")
                time.sleep(0.3)  # ingest took the requests and cannot persist them
                in_flight = client.in_flight
                # counted before the kill: the clients reconnect as soon as their connections close (for an
                # ingest process, when its front sees the link close, a few ms after it died)
                requests_at_kill, connects_at_kill = client.requests, client.connects
                if kill == "ingest":
                    first.kill9()
                elif front is not None:
                    os.kill(front, signal.SIGKILL)
            at_kill = len(client.confirmed)
            what = "ingest" if kill == "ingest" else f"the HTTP front (pid {front})"
            ctx.say(f"{what} SIGKILLed with {in_flight} requests in flight, {at_kill}/{records} confirmed")
            ctx.notes.append(f"{what} killed with {in_flight} requests in flight, {at_kill} of {records} confirmed")
            second = _webhook_ingest(ctx, port) if kill == "ingest" else first
            joined = client.join(300)
        finally:
            client.stop()
        consumer.drain(client.confirmed)
        new_front = front_pid(second.proc.pid)
        survived = second.proc.poll() is None
        rc, out = second.stop()
        ctx.notes.append(f"clients: {client.requests} requests on {client.connects} connections, answers "
                         f"{dict(sorted(client.answers.items(), key=str))}, {client.retries} retries")
        report = _report(ctx, consumer, sorted(set(client.confirmed)), records)
    report.expect(f"killed mid-stream ({at_kill}/{records} confirmed) with requests in flight ({in_flight})",
                  at_kill < records and in_flight > 0)
    report.expect(f"the clients finished without a 4xx ({client.errors[:3]})", joined)
    report.expect(f"keep-alive: {requests_at_kill} requests on {connects_at_kill} connections before the kill",
                  connects_at_kill == connections and requests_at_kill >= 5 * connections)
    if kill == "front":
        report.expect(f"the ingest process lived on with a new front (pid {front} -> {new_front})",
                      survived and front is not None and new_front not in (None, front))
        # the 200s are counted as ingest confirms (before the front writes them); the front's death withdraws
        # those it held, unless a persist confirmed them first: at most the requests in flight at the kill
        counted = re.search(r"requests answered 200: (\d+)", out)
        got = client.answers.get(200, 0)
        report.expect(f"it counted the 200s the clients got, and at most the {in_flight} in flight at the kill "
                      f"more ({counted.group(1) if counted else None} against {got})",
                      counted is not None and got <= int(counted.group(1)) <= got + in_flight)
    report.expect(f"the {'restarted ' if kill == 'ingest' else ''}ingest process exited 0 "
                  f"(exit {rc}; {out.strip().splitlines()[-1:]})", rc == 0)
    return report

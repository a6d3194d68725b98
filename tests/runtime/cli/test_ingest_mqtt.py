"""``ftlayer ingest --mqtt`` (issue 28): the real CLI in child processes, a real Mosquitto, real faults.

The ground truth is the publisher's: the ids the broker acknowledged to it (PUBACK). Every check
reads the persisted records back out of Redis and counts them against it: 0 lost (every
acknowledged id persisted), duplicates counted and printed. The broker's own log (every PUBLISH
it sends with its DUP flag, every PUBACK it receives) shows what crossed the wire and when.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import key_hash
from ftlayer.servers.embedded import EmbeddedServer
from runtime.chaos.mqtt_publisher import Publisher
from runtime.cli.main import main
from runtime.driver.mosquitto import EmbeddedMosquitto
from tests.runtime.mqtt_support import CHANNELS, IngestProcess, loss_and_duplicates, persisted, persisted_ids
from tests.waiting import wait_until

Broker = Callable[..., EmbeddedMosquitto]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of this test's own, to freeze with SIGSTOP."""
    server = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    yield server
    server.stop()


def _ingest(broker_url: str, *extra: str, redis_url: str, namespace: str, source: str = "events",
            client_id: str = "ingest-1", key: tuple[str, ...] = ("--key", "user")) -> IngestProcess:
    return IngestProcess("clicks", source, "--mqtt", broker_url, "--topic", "sensors/#", "--client-id", client_id,
                         *key, *extra, redis_url=redis_url, namespace=namespace)


def _layer(redis_url: str, namespace: str, source: str = "events") -> FTLayer:
    return FTLayer(FTConfig(redis_url=redis_url, namespace=namespace), "clicks", source, num_channels=CHANNELS)


def _records(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"i": i, "user": f"u{i % 7}"} for i in range(start, start + n)]


def _count(broker: EmbeddedMosquitto, pattern: str) -> int:
    return sum(1 for line in broker.log_lines() if re.search(pattern, line))


def _all_persisted(layer: FTLayer, publisher: Publisher, timeout_s: float) -> None:
    wait_until(lambda: set(publisher.confirmed) <= set(persisted_ids(layer)), timeout_s,
               "every record the broker acknowledged to the publisher to be persisted")


@pytest.mark.slow
def test_puback_waits_for_persist_and_a_killed_ingest_gets_the_messages_again(
        mosquitto: Broker, own_redis: EmbeddedServer, namespace: str) -> None:
    """Redis frozen: ingest has the 5 messages and cannot persist them, so no PUBACK may leave; kill -9
    it there, and a new process with the same client id gets all 5 again (DUP) and persists them."""
    broker = mosquitto()
    layer = _layer(own_redis.url, namespace)
    first = _ingest(broker.url, redis_url=own_redis.url, namespace=namespace)
    first.wait_for("subscribed to")
    os.kill(own_redis.pid or 0, signal.SIGSTOP)
    try:
        publisher = Publisher(broker.url, _records(5)).start()
        assert publisher.join(30), "the broker acknowledged all 5 to the publisher"
        publisher.stop()
        wait_until(lambda: _count(broker, r"Sending PUBLISH to ingest-1 \(d0") == 5, 30, "5 messages sent to ingest")
        time.sleep(1.0)  # an early PUBACK would leave within milliseconds of the message
        assert _count(broker, "Received PUBACK from ingest-1") == 0, "a PUBACK before the record was persisted"
        first.kill9()
    finally:
        os.kill(own_redis.pid or 0, signal.SIGCONT)
    second = _ingest(broker.url, redis_url=own_redis.url, namespace=namespace)
    second.wait_for("subscribed to")
    wait_until(lambda: _count(broker, r"Sending PUBLISH to ingest-1 \(d1") == 5, 30, "the broker to resend all 5")
    wait_until(lambda: _count(broker, "Received PUBACK from ingest-1") == 5, 30, "5 PUBACKs, after persist")
    lost, dups = loss_and_duplicates(range(5), persisted_ids(layer))
    print(f"frozen Redis, ingest killed: lost {len(lost)}, duplicates {dups}")
    assert lost == []
    rc, out = second.stop()
    assert rc == 0, out
    assert "session present: True" in out  # the broker kept the session of the killed process


def _unacked(broker: EmbeddedMosquitto, client: str = "ingest-1", qos: int = 1) -> int:
    """Messages the broker sent to ``client`` (resends included) minus the acknowledgements it got back."""
    ack = "PUBACK" if qos == 1 else "PUBREC"
    return _count(broker, rf"Sending PUBLISH to {client} ") - _count(broker, rf"Received {ack} from {client} ")


@pytest.mark.slow
@pytest.mark.parametrize(("qos", "records"), [(1, 2000), (2, 800)])
def test_kill_9_of_the_ingest_process_mid_stream_loses_nothing(
        mosquitto: Broker, own_redis: EmbeddedServer, namespace: str, qos: int, records: int) -> None:
    """kill -9 of ``ftlayer ingest --mqtt`` while the publisher runs, restarted with the same client id.
    Redis is frozen for the last 0.3 s before the kill, so the kill lands while ingest holds messages
    it has received and not persisted (at full speed that window is a few ms wide, and a kill
    would rarely hit it): those must come back from the broker. The publisher is paced (2 ms a
    record, ~0.5 s from a third to its hold at two thirds), so it is still publishing when the
    freeze starts: unpaced it reaches its hold within a poll or two, and an ingest that keeps up
    (one that starts without PySpark) has persisted everything by then, leaving nothing in flight."""
    broker = mosquitto()
    layer = _layer(own_redis.url, namespace)
    first = _ingest(broker.url, "--qos", str(qos), redis_url=own_redis.url, namespace=namespace)
    first.wait_for("subscribed to")
    # it holds at two thirds until after the kill (join releases it): the kill is mid-stream
    publisher = Publisher(broker.url, _records(records), qos=qos, hold_at=2 * records // 3, pace_s=0.002).start()
    try:
        wait_until(lambda: layer.stats()["persisted"] >= records // 3, 120, "a third of the records persisted")
        os.kill(own_redis.pid or 0, signal.SIGSTOP)
        try:
            time.sleep(0.3)
            in_flight = _unacked(broker, qos=qos)
            first.kill9()
        finally:
            os.kill(own_redis.pid or 0, signal.SIGCONT)
        at_kill = len(publisher.confirmed)
        assert at_kill < records, "the kill came after the publisher was done: not mid-stream"
        second = _ingest(broker.url, "--qos", str(qos), redis_url=own_redis.url, namespace=namespace)
        second.wait_for("subscribed to")
        assert publisher.join(180), f"publisher: {len(publisher.confirmed)} of {records} acknowledged"
        _all_persisted(layer, publisher, 60)
    finally:
        publisher.stop()
    rc, out = second.stop()
    assert rc == 0, out
    resent = _count(broker, r"Sending PUBLISH to ingest-1 \(d1")
    lost, dups = loss_and_duplicates(publisher.confirmed, persisted_ids(layer))
    print(f"QoS {qos}, ingest kill -9 with {at_kill}/{records} acknowledged to the publisher and {in_flight} "
          f"unacknowledged by ingest: lost {len(lost)}, duplicates {dups}, resent by the broker {resent}")
    assert len(publisher.confirmed) == records and lost == []
    assert in_flight > 0 and resent > 0, "nothing was in flight at the kill: the test proved nothing"


@pytest.mark.slow
def test_kill_9_of_the_broker_and_restart_loses_nothing(
        mosquitto: Broker, own_redis: EmbeddedServer, namespace: str) -> None:
    """The broker is SIGKILLed while ingest holds messages it could not persist yet (Redis frozen), then
    restarted on the same port and persistence directory: ingest persists what it holds once Redis
    answers (it never drops a message because its connection died), withholds the acks it owed on
    the dead connection, reconnects to its restored session, and the publisher goes on. Whatever
    the restarted broker still had for the session is resent: duplicates, not loss.

    The publisher pauses for a moment before the kill, so the kill does not land in Mosquitto's
    own loss window: it acknowledges a message to the publisher before its next database save,
    and (2.0.11) does not save messages in flight to a connected subscriber at all; see
    docs/sources.md."""
    broker = mosquitto()
    layer = _layer(own_redis.url, namespace)
    ingest = _ingest(broker.url, redis_url=own_redis.url, namespace=namespace)
    ingest.wait_for("subscribed to")
    publisher = Publisher(broker.url, _records(1500), hold_at=1000).start()
    try:
        wait_until(lambda: len(publisher.confirmed) >= 300, 60, "300 records acknowledged to the publisher")
        os.kill(own_redis.pid or 0, signal.SIGSTOP)
        try:
            wait_until(lambda: len(publisher.confirmed) == 1000, 60, "the publisher to reach its hold")
            time.sleep(0.5)  # quiet: the broker saved its database after the last change
            broker.kill9()
            # Redis answers only once ingest has seen the connection die: an ack released before its
            # network thread notices is sent into the dead socket and counted as sent (ci66, 6 workers:
            # "left to the broker 0"; the broker resent those messages all the same)
            ingest.wait_for("connection lost", 60)
        finally:
            os.kill(own_redis.pid or 0, signal.SIGCONT)
        time.sleep(1.0)
        broker.restart()
        publisher.release()
        assert publisher.join(180), f"publisher: {len(publisher.confirmed)} of 1500 acknowledged"
        _all_persisted(layer, publisher, 60)
    finally:
        publisher.stop()
    rc, out = ingest.stop()
    assert rc == 0, out
    lost, dups = loss_and_duplicates(publisher.confirmed, persisted_ids(layer))
    resent = _count(broker, r"Sending PUBLISH to ingest-1 \(d1")
    stale = re.search(r"left to the broker (\d+)", out)
    print(f"broker kill -9 and restart: lost {len(lost)}, duplicates {dups}, resent by the restarted broker {resent}, "
          f"acks dropped with the dead connection {stale.group(1) if stale else '?'}")
    assert len(publisher.confirmed) == 1500 and lost == []
    assert stale is not None and int(stale.group(1)) > 0, "ingest held nothing when the broker died"


@pytest.mark.slow
def test_a_shared_subscription_splits_the_messages_between_two_processes(
        mosquitto: Broker, redis_server_url: str, namespace: str) -> None:
    broker = mosquitto()
    layer = _layer(redis_server_url, namespace)
    procs = [_ingest(broker.url, "--shared-group", "clicks", redis_url=redis_server_url, namespace=namespace,
                     client_id=name) for name in ("ingest-a", "ingest-b")]
    for proc in procs:
        proc.wait_for("subscribed to $share/clicks/sensors/#")
    publisher = Publisher(broker.url, _records(600)).start()
    try:
        assert publisher.join(60)
        _all_persisted(layer, publisher, 60)
    finally:
        publisher.stop()
    counts = []
    for proc in procs:
        rc, out = proc.stop()
        assert rc == 0, out
        counts.append(int(re.findall(r"persisted (\d+),", out)[-1]))
    lost, dups = loss_and_duplicates(publisher.confirmed, persisted_ids(layer))
    print(f"shared subscription: persisted {counts}, lost {len(lost)}, duplicates {dups}")
    assert lost == [] and sum(counts) == 600 and min(counts) > 0


@pytest.mark.slow
def test_the_key_from_a_payload_field_or_from_the_topic(
        mosquitto: Broker, redis_server_url: str, namespace: str) -> None:
    broker = mosquitto()
    by_field = _ingest(broker.url, redis_url=redis_server_url, namespace=namespace, source="byfield",
                       client_id="ingest-field")
    by_topic = _ingest(broker.url, redis_url=redis_server_url, namespace=namespace, source="bytopic",
                       client_id="ingest-topic", key=("--key-topic",))
    for proc in (by_field, by_topic):
        proc.wait_for("subscribed to")
    records = [{"i": i, "user": f"u{i % 3}"} for i in range(12)]
    publisher = Publisher(broker.url, records, topic=lambda v: f"sensors/{v['user']}/x").start()
    try:
        assert publisher.join(30)
        for source in ("byfield", "bytopic"):
            _all_persisted(_layer(redis_server_url, namespace, source), publisher, 30)
    finally:
        publisher.stop()
    for proc in (by_field, by_topic):
        assert proc.stop()[0] == 0
    field = persisted(_layer(redis_server_url, namespace, "byfield"))
    assert sorted((v["i"], h) for v, h in field) == [(r["i"], key_hash(r["user"])) for r in records]
    topic = persisted(_layer(redis_server_url, namespace, "bytopic"))
    assert sorted((v["i"], v["topic"], h) for v, h in topic) == [
        (r["i"], f"sensors/{r['user']}/x", key_hash(f"sensors/{r['user']}/x")) for r in records]


@pytest.mark.slow
def test_a_schema_dead_letters_a_message_that_does_not_fit_and_acknowledges_it(
        mosquitto: Broker, redis_server_url: str, namespace: str) -> None:
    """``--schema``: a message whose record does not fit is dead-lettered with its reason, then acknowledged
    to the broker (it is safe: nothing is left for the broker to resend); the others are persisted."""
    broker = mosquitto()
    proc = _ingest(broker.url, "--schema", "i long not null, user string", redis_url=redis_server_url,
                   namespace=namespace)
    proc.wait_for("subscribed to")
    records: list[dict[str, Any]] = [{**r, "n": r["i"]} for r in _records(12)]  # n: the publisher's id
    records[4]["i"] = "four"
    del records[9]["i"]
    publisher = Publisher(broker.url, records, id_of=lambda v: int(v["n"])).start()
    layer = _layer(redis_server_url, namespace)
    try:
        assert publisher.join(30)
        wait_until(lambda: layer.stats()["persisted"] == 10 and layer.stats()["dead_lettered"] == 2, 30,
                   "10 records persisted and 2 dead-lettered")
    finally:
        publisher.stop()
    rc, out = proc.stop()
    assert rc == 0, out
    assert "received 12, acknowledged 12" in out, out
    assert sorted(v["n"] for v, _ in persisted(layer)) == [n for n in range(12) if n not in (4, 9)]
    reasons = sorted(d.reason for d in layer.list_dead_letters())
    assert reasons[0].startswith("ingest: does not fit the schema: column 'i' (bigint)"), reasons
    assert reasons[1] == "ingest: does not fit the schema: column 'i' is not nullable and the value is missing"


@pytest.mark.slow
def test_sigterm_while_ingest_waits_for_room_exits_0_and_the_broker_keeps_the_rest(
        mosquitto: Broker, redis_server_url: str, namespace: str) -> None:
    """SIGTERM "stops taking messages, persists and acknowledges what was taken, and exits 0", also while
    ingest waits for room (max_pending records pending: no query reads the source); what it never
    acknowledged is the broker's, and the next process with the same client id persists it."""
    broker = mosquitto()
    layer = _layer(redis_server_url, namespace)
    proc = IngestProcess("clicks", "events", "--mqtt", broker.url, "--topic", "sensors/#", "--client-id", "ingest-1",
                         "--max-inflight", "10", redis_url=redis_server_url, namespace=namespace,
                         env={"FTLAYER_MAX_PENDING": "5"})
    proc.wait_for("subscribed to")
    publisher = Publisher(broker.url, _records(60)).start()
    try:
        assert publisher.join(30)
        proc.wait_for("paused: backpressure", 30)
        started = time.monotonic()
        rc, out = proc.stop(timeout_s=30)
        took = time.monotonic() - started
        assert rc == 0 and took < 15, (rc, took, out)
        again = _ingest(broker.url, redis_url=redis_server_url, namespace=namespace)  # no max_pending now
        _all_persisted(layer, publisher, 30)
        assert again.stop()[0] == 0
    finally:
        publisher.stop()
    lost, dups = loss_and_duplicates(publisher.confirmed, persisted_ids(layer))
    print(f"SIGTERM while waiting for room: lost {len(lost)}, duplicates {dups}")
    assert lost == [], lost


def test_a_subscription_refused_on_a_reconnect_ends_in_an_error_line_not_a_traceback(
        mosquitto: Broker, redis_server_url: str, namespace: str) -> None:
    """README: errors are one line (exit 2), never a traceback. The broker restarts granting QoS 0 only
    (``max_qos 0``): the re-subscription is refused, ingest stops with the reason, exit 2."""
    broker = mosquitto()
    proc = _ingest(broker.url, redis_url=redis_server_url, namespace=namespace)
    proc.wait_for("subscribed to")
    broker.kill9()
    plain = broker._config
    broker._config = lambda: plain() + "max_qos 0\n"  # type: ignore[method-assign]
    broker.restart()
    rc, out = proc.run(60)
    assert rc == 2, out
    assert "Traceback" not in out, out
    assert out.splitlines()[-1].startswith("ftlayer: error: ingest stopped: MqttConnectError: "), out
    assert "only QoS 0" in out.splitlines()[-1], out


@pytest.mark.slow
def test_username_and_password_refused_then_accepted(
        mosquitto: Broker, redis_server_url: str, namespace: str) -> None:
    broker = mosquitto(users={"ingest": "s3cret"})
    wrong = broker.url_for("ingest").replace("s3cret", "wrong")
    rc, out = _ingest(wrong, redis_url=redis_server_url, namespace=namespace).run()
    assert rc == 2, out
    assert "ftlayer: error:" in out and "Not authorized" in out and "Traceback" not in out
    assert "wrong" not in out  # the password is never printed
    # one line: the refusal is the error, not also a log line before it
    assert len(out.strip().splitlines()) == 1 and out.startswith("ftlayer: error: MQTT "), out
    # the password from the environment, off the command line
    proc = IngestProcess("clicks", "events", "--topic", "sensors/#", "--client-id", "ingest-pw",
                         redis_url=redis_server_url, namespace=namespace,
                         env={"FTLAYER_INGEST_MQTT": broker.url_for("ingest")})
    proc.wait_for("subscribed to")
    publisher = Publisher(broker.url_for("ingest"), _records(10)).start()
    try:
        assert publisher.join(30)
        _all_persisted(_layer(redis_server_url, namespace), publisher, 30)
    finally:
        publisher.stop()
    rc, out = proc.stop()
    assert rc == 0, out
    assert "s3cret" not in out and "ingest:***@" in out


@pytest.mark.parametrize(("args", "says"), [
    (["--mqtt", "http://127.0.0.1:1883", "--topic", "a"], "scheme 'http'"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a"], "cannot connect to the MQTT broker at mqtt://127.0.0.1:1"),
    (["--mqtt", "mqtt://user:pw@127.0.0.1:1", "--topic", "a"], "mqtt://user:***@127.0.0.1:1"),
    (["--mqtt", "mqtt://127.0.0.1:1"], "needs at least one --topic"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a/#/b"], "is not valid"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a", "--shared-group", "g"], "--shared-group needs --client-id"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a", "--key", "u", "--key-topic"], "give one"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a", "--qos", "0"], "invalid value '0': expected one of 1, 2"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a", "f.jsonl"], "exactly one of them"),
    (["f.jsonl", "--topic", "a"], "--topic is an MQTT option: it needs --mqtt"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a", "--tls-cert", "c.pem"], "give both a client certificate"),
    (["--mqtt", "mqtts://127.0.0.1:1", "--topic", "a", "--tls-ca", "/no/such/ca.pem"], "TLS files do not load"),
])
def test_bad_mqtt_arguments_end_in_one_error_line(args: list[str], says: str, redis_server_url: str,
                                                  namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (the CLI's main, as the console script calls it): exit status 2 and one error line.
    The same path in a child process: test_username_and_password_refused_then_accepted."""
    try:
        rc = main(["ingest", "clicks", "events", *args, "--redis-url", redis_server_url, "--namespace", namespace])
    except SystemExit as exc:  # argparse's usage error
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    assert rc == 2, out
    assert says in out.err and out.err.count("error:") == 1, out.err
    assert "pw@" not in out.out + out.err


@pytest.mark.parametrize(("args", "says"), [
    (["--tls-cert", "c.pem"], "give both a client certificate and its key"),
    (["--tls-key", "k.pem"], "give both a client certificate and its key"),
    (["--tls-ca", "/no/such/ca.pem"], "TLS files do not load (CA '/no/such/ca.pem'"),
])
def test_bad_tls_options_are_refused_before_redis_is_touched(
        args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/sources.md: "a bad URL, filter or option is refused before Redis is touched": with no Redis
    listening, the error is the option's, not the unreachable server's."""
    rc = main(["ingest", "clicks", "events", "--mqtt", "mqtts://127.0.0.1:1", "--topic", "a", *args,
               "--redis-url", "redis://127.0.0.1:1/0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert says in err and err.count("error:") == 1 and "Redis" not in err, err

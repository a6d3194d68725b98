"""The MQTT source in-process, on a real Mosquitto broker and the session's Redis: messages published
at QoS 1 and 2 persisted and acknowledged, values and keys, bad payloads dead-lettered, TLS, the
Python API; and, with a stub client, the two rules that keep an acknowledgement from completing
the wrong message (connection-bound acks, acks in hand-out order)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import key_hash
from runtime.chaos.mqtt_publisher import Publisher
from runtime.driver.ingest import Ingestor
from runtime.driver.mosquitto import EmbeddedMosquitto
from runtime.driver.mqtt import MqttSource, UnparsedMessage
from runtime.driver.mqtt_client import MqttAckError, MqttConfigError, MqttConnectError
from serialization.payload import unpack_payload
from tests.runtime.mqtt_support import CHANNELS, persisted, persisted_ids, self_signed
from tests.waiting import wait_until

Broker = Callable[..., EmbeddedMosquitto]


def _layer(cfg: FTConfig, source: str = "mqtt") -> FTLayer:
    return FTLayer(cfg, "sensors", source, num_channels=CHANNELS).open()


def _log_count(broker: EmbeddedMosquitto, pattern: str) -> int:
    return sum(1 for line in broker.log_lines() if re.search(pattern, line))


@pytest.mark.slow
@pytest.mark.parametrize("qos", [1, 2])
def test_published_records_are_persisted_and_acknowledged_once_each(
        mosquitto: Broker, ft_config: FTConfig, qos: int) -> None:
    broker = mosquitto()
    layer = _layer(ft_config)
    source = MqttSource(broker.url, ["sensors/#"], client_id="ingest-1", qos=qos)
    ing = Ingestor(layer, source, key=lambda v: v["user"]).start()
    publisher = None
    try:
        wait_until(lambda: source.connects == 1, 30, "the source to subscribe")
        records = [{"i": i, "user": f"u{i % 5}"} for i in range(300)]
        publisher = Publisher(broker.url, records, qos=qos, client_id=f"pub-{qos}").start()
        assert publisher.join(60), f"publisher: {len(publisher.confirmed)} of 300 acknowledged"
        wait_until(lambda: source.acked == 300, 30, "300 acknowledgements")
        assert sorted(persisted_ids(layer)) == list(range(300))
        ack = "PUBACK" if qos == 1 else "PUBREC"
        # one each, never twice (the network thread sends them a moment after ack() queued them)
        wait_until(lambda: _log_count(broker, rf"Received {ack} from ingest-1 ") >= 300, 10, f"300 {ack}s")
        assert _log_count(broker, rf"Received {ack} from ingest-1 ") == 300
        if qos == 2:  # every PUBREL of ours completed: nothing left half-done on the broker
            wait_until(lambda: _log_count(broker, r"Received PUBCOMP from ingest-1 ") == 300, 10, "300 PUBCOMPs")
        assert source.stats() == {"received": 300, "acked": 300, "stale": 0, "connects": 1, "queued": 0,
                                  "inflight": 0}
    finally:
        if publisher is not None:
            publisher.stop()
        source.end()
        wait_until(lambda: ing.done, 30, "ingest to end")
        source.close()
    assert ing.error is None


def test_values_keys_and_payloads_that_do_not_decode(mosquitto: Broker, ft_config: FTConfig) -> None:
    """JSON objects keyed by a field or by the topic added to them; text, JSON that is not an object,
    invalid JSON and JSON null: the last two dead-lettered (and acknowledged), the others persisted."""
    broker = mosquitto()
    layer = _layer(ft_config, "keyed")
    source = MqttSource(broker.url, ["a/#", "b/+"], client_id="ingest-keys", topic_field="topic")
    ing = Ingestor(layer, source, key=lambda v: v["topic"]).start()
    publisher = None
    try:
        wait_until(lambda: source.connects == 1, 30, "the source to subscribe")
        sent = [("a/x", {"i": 0, "topic": "overwritten"}), ("b/y", [1, 2]), ("a/z/w", "text"),
                ("b/y", b"{not json"), ("a/x", None), ("c/ignored", {"i": 9})]
        payloads = [(t, v if isinstance(v, bytes) else json.dumps(v).encode()) for t, v in sent]
        publisher = Publisher(broker.url, range(len(payloads)), topic=lambda k: payloads[k][0],
                              encode=lambda k: payloads[k][1], id_of=int, client_id="pub-keys")
        publisher.start()
        assert publisher.join(30)
        wait_until(lambda: source.acked == 5, 30, "5 acknowledgements (c/ignored is not subscribed)")
        got = sorted(persisted(layer), key=repr)
        assert got == sorted([
            ({"i": 0, "topic": "a/x"}, key_hash("a/x")),
            ({"topic": "b/y", "payload": [1, 2]}, key_hash("b/y")),
            ({"topic": "a/z/w", "payload": "text"}, key_hash("a/z/w")),
        ], key=repr)
        letters = sorted(str(unpack_payload(d.record.payload)) for d in layer.list_dead_letters() if d.record)
        assert len(letters) == 2, letters
        assert letters[0].startswith("UnparsedMessage('a/x': JSON null is not a record: b'null')"), letters
        assert letters[1].startswith("UnparsedMessage('b/y': not JSON: "), letters
        assert letters[1].endswith(": b'{not json')"), letters
        assert ing.rejected == 2
    finally:
        if publisher is not None:
            publisher.stop()
        source.end()
        wait_until(lambda: ing.done, 30, "ingest to end")
        source.close()


def test_tls_and_the_python_api(mosquitto: Broker, ft_config: FTConfig, tmp_path: Path) -> None:
    """``ftlayer.ingest`` (the DataFrame path's ingest, no JVM needed) takes an MqttSource like any source;
    over mqtts:// with the broker's certificate as CA."""
    import ftlayer

    cert, key = self_signed(tmp_path)
    broker = mosquitto(tls=(str(cert), str(key)))
    source = MqttSource(broker.url, "sensors/+", client_id="ingest-tls", tls_ca=str(cert), protocol="3.1.1")
    ing = ftlayer.ingest("sensors", "tls", source, config=ft_config, num_channels=CHANNELS, key=lambda v: v["user"])
    publisher = None
    try:
        wait_until(lambda: source.connects == 1, 30, "the source to subscribe over TLS")
        publisher = Publisher(broker.url, [{"i": i, "user": "u"} for i in range(50)], client_id="pub-tls",
                              tls_ca=str(cert)).start()
        assert publisher.join(30)
        wait_until(lambda: source.acked == 50, 30, "50 acknowledgements")
        assert sorted(persisted_ids(_layer(ft_config, "tls"))) == list(range(50))
    finally:
        if publisher is not None:
            publisher.stop()
        source.end()
        wait_until(lambda: ing.done, 30, "ingest to end")
        source.close()
        from runtime.dataframe.sources import stop_all

        stop_all()


def test_refusals_are_clear(mosquitto: Broker) -> None:
    broker = mosquitto(users={"ingest": "s3cret"})
    with pytest.raises(MqttConnectError, match=r"refused the connection.*[Nn]ot authori[sz]ed") as info:
        MqttSource(broker.url_for("ingest").replace("s3cret", "wrong"), "t/#", client_id="x").open()
    assert "wrong" not in str(info.value) and "***" in str(info.value)  # the password is never shown
    ok = MqttSource(broker.url_for("ingest"), "t/#", client_id="x")
    ok.open()
    ok.close()
    with pytest.raises(MqttConnectError, match=r"cannot connect to the MQTT broker at mqtt://127\.0\.0\.1:1: Conn"):
        MqttSource("mqtt://127.0.0.1:1", "t/#", client_id="x").open()
    for bad, what in [("http://h", "scheme 'http'"), ("mqtt://", "names no host"), ("mqtt://h:99999", "out of range")]:
        with pytest.raises(MqttConfigError, match=what):
            MqttSource(bad, "t/#", client_id="x")
    with pytest.raises(MqttConfigError, match="QoS 0 has no acknowledgement"):
        MqttSource(broker.url, "t/#", client_id="x", qos=0)
    with pytest.raises(MqttConfigError, match="not valid"):
        MqttSource(broker.url, "t/#/x", client_id="x")


# --- the acknowledgement rules, with a stub client ---------------------------------------
class _StubClient:
    def __init__(self) -> None:
        self.released: list[tuple[int, int]] = []

    def release(self, mid: int, qos: int) -> None:
        self.released.append((mid, qos))


def _stubbed() -> tuple[MqttSource, _StubClient]:
    source = MqttSource("mqtt://127.0.0.1:1", "t/#", client_id="stub")
    client = _StubClient()
    source._client = client
    source._subscribe = lambda _c: None  # type: ignore[method-assign]
    return source, client


def _connect(source: MqttSource) -> None:
    source._on_connect(None, None, SimpleNamespace(session_present=True), SimpleNamespace(is_failure=False), None)


def _deliver(source: MqttSource, mid: int, payload: Any, qos: int = 1) -> None:
    source._on_message(None, None, SimpleNamespace(topic="t/x", payload=json.dumps(payload).encode(), mid=mid,
                                                   qos=qos))


def test_an_ack_owed_on_a_lost_connection_is_never_sent_on_the_next_one() -> None:
    """Message A (packet id 5) is handed out, the connection drops, the broker resends A as id 5 on the
    next one: acking the first copy must send nothing (the broker may already have given id 5 to
    another message once the second copy is acked), acking the resent copy sends PUBACK 5."""
    source, client = _stubbed()
    _connect(source)
    _deliver(source, 5, {"i": "A"})
    first = list(source.poll() or [])
    source._on_disconnect(None, None, None, "lost", None)
    _connect(source)
    _deliver(source, 5, {"i": "A"})  # the broker's resend, same packet id
    second = list(source.poll() or [])
    source.ack(first)
    assert client.released == [] and source.stale == 1
    source.ack(second)
    assert client.released == [(5, 1)] and source.acked == 1


def test_acks_must_come_in_hand_out_order_and_for_the_values_handed_out() -> None:
    source, client = _stubbed()
    _connect(source)
    for mid in (1, 2, 3):
        _deliver(source, mid, {"i": mid}, qos=2)
    values = list(source.poll() or [])
    with pytest.raises(MqttAckError, match="out of order"):
        source.ack([values[1]])
    with pytest.raises(MqttAckError, match="out of order"):
        source.ack([{"i": 1}])  # equal, not the same object
    with pytest.raises(MqttAckError, match="only 3 were handed out"):
        source.ack([*values, values[0]])
    assert client.released == []
    source.ack(values[:2])
    source.ack(values[2:])
    assert client.released == [(1, 2), (2, 2), (3, 2)]


def test_a_null_or_undecodable_payload_is_never_none() -> None:
    """Ingest reads None as "nothing now" and would skip it, and the acks would then be off by one."""
    source, _client = _stubbed()
    _connect(source)
    source._on_message(None, None, SimpleNamespace(topic="t/x", payload=b"null", mid=1, qos=1))
    source._on_message(None, None, SimpleNamespace(topic="t/x", payload=b"\xff", mid=2, qos=1))
    values = list(source.poll() or [])
    assert [type(v) for v in values] == [UnparsedMessage, UnparsedMessage]
    with pytest.raises(ValueError, match="JSON null"):
        values[0]["user"]


def test_without_paho_the_error_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from runtime.driver.mqtt_client import MqttError

    monkeypatch.setitem(sys.modules, "paho.mqtt.client", None)  # import fails as if not installed
    with pytest.raises(MqttError, match=r"needs paho-mqtt: pip install 'ftlayer\[mqtt\]'"):
        MqttSource("mqtt://127.0.0.1:1", "t/#", client_id="x").open()


def test_a_drawn_port_taken_before_the_broker_binds_is_drawn_again(mosquitto_binary: Path, tmp_path: Path) -> None:
    """Another process binds the broker's drawn port first (test workers start brokers side by
    side): the broker exits with "Address already in use" and a first start draws a new port."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        broker = EmbeddedMosquitto(tmp_path)
        broker.port = taken.getsockname()[1]  # as if drawn, then taken
        try:
            broker.start()
            assert broker.port != taken.getsockname()[1] and broker.pid is not None
            with socket.create_connection(("127.0.0.1", broker.port), timeout=5):
                pass
        finally:
            broker.stop()

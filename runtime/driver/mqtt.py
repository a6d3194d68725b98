"""An MQTT subscription as an ftlayer source: a message is acknowledged to the broker only once it is persisted.

::

    events = MqttSource("mqtt://user:secret@broker:1883", ["sensors/#"], client_id="ingest-1")
    topo.source("events", events, key=lambda e: e["device"]).map(...).sink(...)   # or ftlayer.ingest(...)
    query = topo.start(spark)
    ...
    events.end()                        # stop taking messages; the source ends once what it took is persisted

Contract (paho-mqtt underneath; :mod:`runtime.driver.mqtt_client` says why that library):

- **Subscription.** QoS 1 by default, or 2, on a **persistent session**: a fixed ``client_id``,
  MQTT 5 ``clean_start=False`` with ``session_expiry_s`` (default: never expires), or MQTT 3.1.1
  clean session off. The broker keeps the subscription and queues messages while no ingest is
  connected. Topic filters may use ``+`` and ``#``; ``shared_group="g"`` subscribes
  ``$share/g/<filter>``, so several ingest processes (each with its own ``client_id``) split
  the messages. Re-subscribing after a reconnect does not resend retained messages (MQTT 5
  retain handling 1). A subscription the broker refuses, or grants only at QoS 0, raises
  :class:`~runtime.driver.mqtt_client.MqttConnectError` (a QoS 0 message has no
  acknowledgement, so nothing could keep it).
- **Acknowledgement.** The PUBACK (QoS 1), or the PUBREC (QoS 2), of a message goes out in the
  source's ``ack`` hook, which ingest calls once the message's record is persisted (durable as
  the ``durability`` mode promises: with ``waitaof`` or ``replicated`` after the fsync or the
  replica confirmed it) or, if ingest rejected it, dead-lettered; in the order the messages
  arrived, as MQTT requires. A message never acknowledged is the broker's until then: if the
  ingest process or the driver dies (kill -9 included), the broker sends it again when the same
  ``client_id`` reconnects. So **nothing is lost, and duplicates are possible** (a message
  persisted whose acknowledgement did not reach the broker is persisted again, under a new
  record id). A message published at QoS 0 is delivered at QoS 0 and has nothing to
  acknowledge (its publisher accepted that it may be lost).
- **Connections.** ``open()`` connects and subscribes, or raises ``MqttConnectError`` (broker
  unreachable, credentials refused, subscription refused) within ``connect_timeout_s``. After
  that a lost connection is retried for ever (0.2 s to 5 s apart). Acknowledgements are tied
  to the connection a message came on: those still owed when it drops are never sent on the
  next one (the broker sends those messages again, ftlayer persists them again). A stale
  acknowledgement could otherwise complete a packet id the broker has meanwhile given to a
  new message, before that one was persisted.
- **Values.** ``fmt="json"`` (default): the decoded JSON payload; ``"text"``: the payload as
  UTF-8 text; ``"bytes"``: the raw payload. With ``topic_field="topic"`` the message's topic is
  added to a JSON object under that name (it replaces a field of that name), and any other
  payload becomes ``{"topic": ..., "payload": value}``: a key selector can then key by topic.
  A payload that does not decode (or the JSON ``null``, which ingest would read as "nothing
  now") becomes an :class:`UnparsedMessage`, which ingest dead-letters (topic, error and the
  start of the payload kept) and then acknowledges.
- **Backpressure.** Ingest stops polling while it waits (``max_pending`` records pending, Redis
  unreachable) and acknowledges nothing meanwhile, so the broker stops sending once
  ``max_inflight`` messages are unacknowledged (MQTT 5 Receive Maximum; MQTT 3.1.1: the
  broker's own setting, ``max_inflight_messages`` in mosquitto). Messages that arrive keep
  waiting in the broker's queue for this session (mind its limit: mosquitto's
  ``max_queued_messages``, default 1000, drops QoS 1 and 2 messages beyond it).
- **Ending.** :meth:`end` stops taking messages; :meth:`poll` returns None once everything
  handed to ingest is acknowledged. :meth:`close` disconnects (the session stays); messages
  received and not yet handed over are simply not acknowledged, so the broker keeps them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ftlayer.logs import logger_for
from runtime.driver.mqtt_client import (
    PROTOCOLS,
    BrokerAddress,
    MqttAckError,
    MqttConfigError,
    MqttConnectError,
    check_tls,
    check_topic_filter,
    make_client,
)

__all__ = ["MqttSource", "UnparsedMessage"]

log = logger_for(__name__)
GATHER_S = 0.002  # poll(): with messages waiting for their acknowledgement, how long more may be gathered

Format = Literal["json", "text", "bytes"]
NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry interval that means "never"
PREVIEW_BYTES = 500


class UnparsedMessage:
    """A message whose payload does not decode; ingest rejects it (it cannot be serialized) into the dead letters."""

    __slots__ = ("error", "payload", "topic")

    def __init__(self, topic: str, payload: bytes, error: str) -> None:
        self.topic, self.payload, self.error = topic, payload, error

    def __repr__(self) -> str:  # the dead letter keeps the repr as its payload
        return f"UnparsedMessage({self.topic!r}: {self.error}: {self.payload[:PREVIEW_BYTES]!r})"

    def __getitem__(self, _key: Any) -> Any:  # a key selector on it fails with the reason
        msg = f"MQTT message on {self.topic!r} has no usable payload: {self.error}"
        raise ValueError(msg)


@dataclass(eq=False)
class _Received:
    """One message: its value for ingest, and what acknowledging it takes (on which connection)."""

    value: Any
    mid: int
    qos: int
    connection: int


class MqttSource:
    """An open/poll/close source fed by an MQTT subscription, with the ``ack`` hook (see the module contract)."""

    def __init__(
        self,
        url: str,
        topics: str | Sequence[str],
        *,
        client_id: str,
        qos: int = 1,
        shared_group: str | None = None,
        fmt: Format = "json",
        topic_field: str | None = None,
        protocol: str = "5",
        session_expiry_s: int = NEVER_EXPIRES,
        max_inflight: int = 1000,
        keepalive_s: int = 30,
        connect_timeout_s: float = 10.0,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        chunk: int = 1000,
    ) -> None:
        self.address = BrokerAddress.parse(url)
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        if not self.topics:
            msg = "MqttSource needs at least one topic filter"
            raise MqttConfigError(msg)
        for topic in self.topics:
            check_topic_filter(topic)
        if qos not in (1, 2):
            msg = (f"MQTT qos {qos!r}: expected 1 or 2 (QoS 0 has no acknowledgement, so a message could be "
                   "lost between the broker and Redis)")
            raise MqttConfigError(msg)
        if shared_group is not None and (not shared_group or any(c in shared_group for c in "/+#")):
            msg = f"MQTT shared group {shared_group!r}: a non-empty name without '/', '+' or '#'"
            raise MqttConfigError(msg)
        if not client_id:
            msg = ("MqttSource needs a client_id: the broker keeps the session (subscription, unacknowledged "
                   "messages) under it")
            raise MqttConfigError(msg)
        if fmt not in ("json", "text", "bytes"):
            msg = f"MQTT payload format {fmt!r}: expected json, text or bytes"
            raise MqttConfigError(msg)
        if protocol not in PROTOCOLS:
            msg = f"MQTT protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}"
            raise MqttConfigError(msg)
        if not 1 <= max_inflight <= 65535:
            msg = f"MQTT max_inflight {max_inflight}: expected 1..65535 (MQTT 5 Receive Maximum)"
            raise MqttConfigError(msg)
        check_tls(tls_ca, tls_cert, tls_key)
        self.client_id = client_id
        self.qos = qos
        self.shared_group = shared_group
        self.fmt = fmt
        self.topic_field = topic_field
        self.protocol = protocol
        self.session_expiry_s = session_expiry_s
        self.max_inflight = max_inflight
        self.keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.tls = (tls_ca, tls_cert, tls_key)
        self.chunk = chunk
        # counters (read them for progress and tests)
        self.received = 0  # messages taken from the broker (redeliveries included)
        self.acked = 0  # acknowledgements sent (PUBACK, or PUBREC for QoS 2)
        self.stale = 0  # acknowledgements not sent: their connection was gone (the broker resends those)
        self.connects = 0  # successful connections (1 + reconnects)
        self.session_present: bool | None = None  # the broker still had this client's session at the last connect
        self._lock = threading.Condition()
        self._queue: deque[_Received] = deque()  # received, not yet polled
        self._inflight: deque[_Received] = deque()  # polled, waiting for ack, in poll order
        self._connection = 0  # bumped on every connect and disconnect: acks of an older one are stale
        self._connected = False
        self._subscribe_mid: int | None = None
        self._subscribed = threading.Event()
        self._failure: str | None = None  # why the last connect or subscribe failed
        self._error: BaseException | None = None  # a refused subscription: poll raises it
        self._ending = False
        self._client: Any = None

    # --- what subscribing means ----------------------------------------------------------
    @property
    def filters(self) -> list[str]:
        """The filters subscribed to (``$share/<group>/`` prefixed with a shared group)."""
        if self.shared_group is None:
            return list(self.topics)
        return [f"$share/{self.shared_group}/{t}" for t in self.topics]

    def _subscribe(self, client: Any) -> None:
        from paho.mqtt.subscribeoptions import SubscribeOptions

        if self.protocol == "5":  # retain handling 1: retained messages only for a new subscription
            options = SubscribeOptions(qos=self.qos, retainHandling=1)
            wanted: list[tuple[str, Any]] = [(f, options) for f in self.filters]
        else:
            wanted = [(f, self.qos) for f in self.filters]
        _rc, mid = client.subscribe(wanted)
        with self._lock:
            self._subscribe_mid = mid

    # --- paho callbacks (its network thread) ------------------------------------------
    def _on_connect(self, client: Any, _userdata: Any, flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            with self._lock:
                self._failure = f"the broker refused the connection: {reason}"
                opening = self.connects == 0  # open() raises it: the caller's one error, not a log line too
            log.log(logging.DEBUG if opening else logging.WARNING, "MQTT %s refused client %s: %s",
                    self.address.masked, self.client_id, reason)
            return
        with self._lock:
            self._connection += 1
            self._connected = True
            self._failure = None
            self.connects += 1
            self.session_present = bool(getattr(flags, "session_present", False))
        if self.connects > 1:
            log.warning("MQTT %s: reconnected (session present: %s)", self.address.masked, self.session_present)
        self._subscribe(client)

    def _on_disconnect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        with self._lock:  # from now on, acks owed on that connection are stale (see the module contract)
            self._connection += 1
            was, self._connected = self._connected, False
        if was and not self._ending:
            log.warning("MQTT %s: connection lost (%s); reconnecting", self.address.masked, reason)

    def _on_subscribe(self, _client: Any, _userdata: Any, mid: int, reasons: list[Any], _props: Any) -> None:
        problem = None
        for topic, reason in zip(self.filters, reasons, strict=False):
            if reason.value >= 0x80:  # a failure code (not authorized, quota, shared subscriptions off...)
                problem = f"the broker refused the subscription to {topic!r} ({reason})"
            elif reason.value == 0:
                problem = f"the broker granted {topic!r} only QoS 0, which has no acknowledgement"
        with self._lock:
            if mid != self._subscribe_mid:
                return
            if problem is not None:
                self._failure = problem
                msg = f"MQTT {self.address.masked}: {problem}"
                self._error = MqttConnectError(msg)
                self._lock.notify_all()
        if problem is None:
            self._subscribed.set()
        elif self._subscribed.is_set():  # a re-subscription after a reconnect (during open() it raises it)
            log.error("MQTT %s: %s", self.address.masked, problem)

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        value = self._decode(message.topic, bytes(message.payload))
        with self._lock:
            if self._ending:  # not acknowledged: the broker keeps it for the next connection
                return
            self._queue.append(_Received(value, message.mid, message.qos, self._connection))
            self.received += 1
            self._lock.notify_all()

    def _decode(self, topic: str, payload: bytes) -> Any:
        value: Any
        if self.fmt == "bytes":
            value = payload
        else:
            try:
                value = payload.decode("utf-8") if self.fmt == "text" else json.loads(payload)
            except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError both
                return UnparsedMessage(topic, payload, f"not {'UTF-8' if self.fmt == 'text' else 'JSON'}: {exc}")
            if value is None:
                return UnparsedMessage(topic, payload, "JSON null is not a record")
        if self.topic_field is None:
            return value
        if isinstance(value, dict):
            return {**value, self.topic_field: topic}
        return {self.topic_field: topic, "payload": value}

    # --- the source protocol (runtime.driver.ingest) ---------------------------------------------
    def open(self) -> None:
        """Connect, subscribe and start the network thread; :class:`MqttConnectError` if the broker cannot
        be reached, refuses the client or the subscription within ``connect_timeout_s``. Idempotent."""
        if self._client is not None:
            return
        ca, cert, key = self.tls
        client = make_client(self.address, client_id=self.client_id, protocol=self.protocol,
                             tls_ca=ca, tls_cert=cert, tls_key=key)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.reconnect_delay_set(min_delay=0.2, max_delay=5)  # paho takes floats despite its int hints
        self._subscribed.clear()
        with self._lock:
            self._ending = False
            self._error = self._failure = None
        try:
            client.connect(self.address.host, self.address.port, keepalive=self.keepalive_s,
                           **self._connect_args())
        except (OSError, ValueError) as exc:  # refused, unreachable, TLS handshake, a bad host name
            msg = f"cannot connect to the MQTT broker at {self.address.masked}: {type(exc).__name__}: {exc}"
            raise MqttConnectError(msg) from exc
        client.loop_start()
        self._client = client
        deadline = time.monotonic() + self.connect_timeout_s
        while not self._subscribed.wait(0.05):
            with self._lock:  # a refusal is an answer: no point waiting for the next one
                failure, error = self._failure, self._error
            if error is None and failure is None and time.monotonic() < deadline:
                continue
            self.close()
            if error is not None:
                raise error
            if failure is not None:
                msg = f"MQTT {self.address.masked}: {failure}"
                raise MqttConnectError(msg)
            msg = f"MQTT {self.address.masked}: not connected and subscribed within {self.connect_timeout_s:g} s"
            raise MqttConnectError(msg)
        log.info("MQTT %s: client %s subscribed to %s at QoS %d (session present: %s)", self.address.masked,
                 self.client_id, self.filters, self.qos, self.session_present)

    def _connect_args(self) -> dict[str, Any]:
        if self.protocol != "5":
            return {}  # clean session off was set on the client
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self.session_expiry_s
        props.ReceiveMaximum = self.max_inflight
        return {"clean_start": False, "properties": props}

    waits_when_idle = True  # poll() waits by itself: ingest polls again at once (runtime.driver.ingest)

    def poll(self) -> Iterable[Any] | None:
        """Values of received messages (up to ``chunk``), None once :meth:`end` was called and everything
        handed over was acknowledged, else [] if none came within 50 ms, or within ``GATHER_S`` while
        messages handed over wait for their acknowledgement: the broker sends no more than
        ``max_inflight`` unacknowledged, and an idle poll is what makes ingest persist its batch."""
        with self._lock:
            if self._error is not None:
                raise self._error
            if not self._queue:
                if self._ending:
                    return [] if self._inflight else None
                self._lock.wait(GATHER_S if self._inflight else 0.05)
            out: list[Any] = []
            while self._queue and len(out) < self.chunk:
                entry = self._queue.popleft()
                self._inflight.append(entry)
                out.append(entry.value)
            return out

    def ack(self, values: list[Any]) -> None:
        """Ingest's confirmation: ``values`` (the next ones in poll order) are safe; acknowledge their messages
        on the connection they came on (see the module contract). :class:`MqttAckError`, and nothing sent,
        if they are not the values handed out next."""
        with self._lock:
            if len(values) > len(self._inflight):
                msg = f"ack of {len(values)} values, but only {len(self._inflight)} were handed out and not acked"
                raise MqttAckError(msg)
            entries = [self._inflight[k] for k in range(len(values))]
            for k, (entry, value) in enumerate(zip(entries, values, strict=True)):
                if entry.value is not value:  # identity, not equality: two messages may carry equal values
                    msg = f"ack out of order: value {k} of the ack is not the message handed out in that place"
                    raise MqttAckError(msg)
            for _ in entries:
                self._inflight.popleft()
            # under the lock: a disconnect bumps the connection first, so no ack of an older
            # connection can be queued on a newer one
            client = self._client
            for entry in entries:
                if entry.qos == 0:
                    continue
                if client is None or entry.connection != self._connection:
                    self.stale += 1
                    continue
                client.release(entry.mid, entry.qos)
                self.acked += 1

    def end(self) -> None:
        """Take no more messages; :meth:`poll` ends the source once everything handed over is acknowledged."""
        with self._lock:
            self._ending = True
            self._lock.notify_all()

    def close(self) -> None:
        """Disconnect (the session stays on the broker); messages not acknowledged are sent again next time."""
        client, self._client = self._client, None
        with self._lock:
            self._ending = True
            self._queue.clear()
            self._inflight.clear()
            self._connection += 1
        if client is not None:
            client.disconnect()
            client.loop_stop()

    @property
    def connected(self) -> bool:
        with self._lock:
            return self._connected

    def stats(self) -> dict[str, int]:
        """Counters: received, acked, stale, connects, queued (received, not polled), inflight (polled, not acked).

        ``stale`` counts the acknowledgements withheld because their connection was already known to be
        lost. One released in the moment between a connection's death and the network thread noticing
        it counts as ``acked``: the client drops it with the dead connection (paho clears its outgoing
        packets on reconnect, so it never goes out on the next one), and the broker sends its message
        again all the same."""
        with self._lock:
            return {"received": self.received, "acked": self.acked, "stale": self.stale, "connects": self.connects,
                    "queued": len(self._queue), "inflight": len(self._inflight)}

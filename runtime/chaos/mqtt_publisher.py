"""An MQTT publisher that keeps what the broker acknowledged: the ground truth of the MQTT tests and chaos.

:class:`Publisher` publishes JSON records at QoS 1 (or 2) from a thread of its own through
paho-mqtt, and records the id of every record the broker acknowledged (PUBACK, or PUBCOMP for
QoS 2, without a failure reason code) in ``confirmed``. A record in ``confirmed`` is the
broker's responsibility; with an ftlayer MQTT source subscribed, it must end up persisted,
whatever happens to the ingest process, the driver or the broker (see
:mod:`runtime.driver.mqtt`). paho keeps the records not yet acknowledged and sends them again
when it reconnects (after a broker restart), so the publisher itself loses nothing.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from runtime.driver.mqtt_client import BrokerAddress, paho


def sensor_topic(value: Any) -> str:
    """The default topic of a record: ``sensors/<user>``."""
    return f"sensors/{value['user']}"


class Publisher:
    """Publishes ``records`` (``encode``: JSON by default) and collects the ids the broker acknowledged.

    ``pace_s``: pause after each publish (a steady producer); ``hold_at``: publish no record
    beyond the first ``hold_at`` until :meth:`release` (a harness that must fault something
    before every record is out uses it); ``max_inflight``: records published and not yet
    acknowledged at a time (paho queues the rest; mosquitto announces a Receive Maximum of 20 and
    drops a client that sends more).
    """

    def __init__(
        self,
        url: str,
        records: Iterable[Any],
        *,
        qos: int = 1,
        topic: Callable[[Any], str] = sensor_topic,
        id_of: Callable[[Any], int] = lambda v: int(v["i"]),
        encode: Callable[[Any], str | bytes] = json.dumps,
        tls_ca: str | None = None,
        client_id: str = "ftlayer-test-publisher",
        pace_s: float = 0.0,
        hold_at: int | None = None,
        max_inflight: int = 20,
    ) -> None:
        mqtt = paho()
        from paho.mqtt.enums import CallbackAPIVersion

        self.address = BrokerAddress.parse(url)
        self._todo = list(records)
        self.qos = qos
        self.topic = topic
        self.id_of = id_of
        self.encode = encode
        self.pace_s = pace_s
        self.confirmed: list[int] = []  # ids the broker acknowledged, in that order
        self.refused: list[int] = []  # ids acknowledged with a failure reason code
        self.published = 0  # records handed to paho
        self._acks: deque[tuple[int, bool]] = deque()  # (mid, ok) from paho's thread
        self._by_mid: dict[int, int] = {}  # packet id -> record id, while unacknowledged
        self._hold_at = hold_at
        self._released = threading.Event()
        if hold_at is None:
            self._released.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        if self.address.username is not None:
            self._client.username_pw_set(self.address.username, self.address.password)
        if self.address.tls or tls_ca:
            self._client.tls_set(ca_certs=tls_ca)
        self._client.max_inflight_messages_set(max_inflight)
        self._client.max_queued_messages_set(0)
        self._client.reconnect_delay_set(min_delay=1, max_delay=2)
        # paho calls on_publish holding its own lock: only a deque append here, mapped later
        self._client.on_publish = lambda _c, _u, mid, reason, _p: self._acks.append((mid, not reason.is_failure))

    def _sweep(self) -> None:
        while self._acks:
            mid, ok = self._acks.popleft()
            rid = self._by_mid.pop(mid, None)
            if rid is not None:
                (self.confirmed if ok else self.refused).append(rid)

    def _run(self) -> None:
        for k, value in enumerate(self._todo):
            while self._hold_at is not None and k >= self._hold_at and not self._released.is_set():
                if self._stop.is_set():
                    return
                self._sweep()
                self._released.wait(0.05)
            if self._stop.is_set():
                return
            info = self._client.publish(self.topic(value), self.encode(value), qos=self.qos)
            self._by_mid[info.mid] = self.id_of(value)
            self.published += 1
            self._sweep()
            if self.pace_s:
                self._stop.wait(self.pace_s)
        while not self._stop.is_set() and self._by_mid:  # until every record is acknowledged
            self._sweep()
            time.sleep(0.01)
        self._sweep()

    def start(self) -> Publisher:
        """Connect (paho then reconnects by itself) and start publishing."""
        self._client.connect(self.address.host, self.address.port, keepalive=10)
        self._client.loop_start()
        self._thread = threading.Thread(target=self._run, name="mqtt-publisher", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Publish the records beyond ``hold_at`` too."""
        self._released.set()

    def hold_at(self, hold_at: int) -> None:
        """Move the hold (before :meth:`release`): publish the records up to ``hold_at``, then hold again."""
        self._hold_at = hold_at

    @property
    def done(self) -> bool:
        """Every record was published and acknowledged."""
        return self._thread is not None and not self._thread.is_alive() and not self._by_mid

    def join(self, timeout_s: float) -> bool:
        """Release a hold and wait until every record is acknowledged; False on timeout."""
        self.release()
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.done

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._client.disconnect()
        self._client.loop_stop()

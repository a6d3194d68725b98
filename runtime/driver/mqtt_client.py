"""The client side of :mod:`runtime.driver.mqtt`: the broker URL, the paho-mqtt client, QoS 2 held until persisted.

The library is **paho-mqtt** (Eclipse Foundation, 2.x; the optional extra ``ftlayer[mqtt]``): it
is the maintained reference client for Python, speaks MQTT 3.1.1 and 5, TLS, shared
subscriptions, and has manual acknowledgement (``manual_ack=True``, ``Client.ack``), which is what
the source needs: a PUBACK goes out when ftlayer says so, not when the message arrives. It runs
its network loop in a thread of its own (``loop_start``), which suits ingest's pulling thread;
aiomqtt (asyncio, built on paho) and gmqtt (asyncio) would need an event loop beside it.

**QoS 2 and paho.** With ``manual_ack`` paho still sends a QoS 2 message's PUBREC as soon as the
PUBLISH arrives and hands the message to the application only at PUBREL. PUBREC is the step
that moves the message's ownership from the broker to the client: a client killed after it, and
before the message was persisted, loses the message (the broker only resends PUBREL). So
:class:`HoldingClient` changes three private steps of paho (checked against the 2.2 series,
which the extra pins): the message is handed over on PUBLISH, its PUBREC is held until
:meth:`HoldingClient.release` (ftlayer's ack, after persist), and every PUBREL gets its PUBCOMP
(a PUBREL only ever follows a PUBREC, so the message is persisted; a process restarted after
its PUBREC gets the PUBREL of a message it never saw, and must still complete it). QoS 2 then
gives what QoS 1 gives: at least once, never lost; the broker's exactly-once does not reach
through a restart of the receiver.
"""

from __future__ import annotations

import importlib
import ssl
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ftlayer.config import mask_url
from ftlayer.errors import FTLayerError

if TYPE_CHECKING:
    from paho.mqtt.client import Client

__all__ = [
    "PROTOCOLS", "BrokerAddress", "MqttAckError", "MqttConfigError", "MqttConnectError", "MqttError",
    "check_tls", "make_client", "paho",
]

# URL schemes: plain TCP and TLS, with the IANA ports
SCHEMES = {"mqtt": (False, 1883), "tcp": (False, 1883), "mqtts": (True, 8883), "ssl": (True, 8883)}
PROTOCOLS = ("5", "3.1.1")


class MqttError(FTLayerError):
    """The MQTT source cannot do what it was asked; the message names the broker (password masked)."""


class MqttConfigError(MqttError, ValueError):
    """A bad broker URL, topic filter, QoS or option of the MQTT source."""


class MqttConnectError(MqttError, ConnectionError):
    """The broker could not be reached, refused the connection, or refused a subscription."""


class MqttAckError(MqttError):
    """Ingest acknowledged values the source did not hand out in that order (a broken caller); no PUBACK sent."""


def paho() -> ModuleType:
    """``paho.mqtt.client``, or :class:`MqttError` saying how to install it (the optional extra ``mqtt``;
    the same message as ``runtime.idempotent.extras.import_extra``, which sits above this floor)."""
    try:
        return importlib.import_module("paho.mqtt.client")
    except ImportError as exc:
        msg = "the MQTT source needs paho-mqtt: pip install 'ftlayer[mqtt]'"
        raise MqttError(msg) from exc


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker is: ``mqtt://[user[:password]@]host[:port]`` (``mqtts://`` for TLS)."""

    url: str
    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        """The address of ``url``; :class:`MqttConfigError` naming what is wrong (password masked)."""
        shown = mask_url(url)
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            msg = f"MQTT broker URL {shown!r}: {exc}; expected mqtt://[user[:password]@]host[:port] or mqtts://..."
            raise MqttConfigError(msg) from exc
        scheme = parts.scheme.lower()
        if scheme not in SCHEMES:
            msg = (f"MQTT broker URL {shown!r}: scheme {parts.scheme!r} is not one of "
                   f"{', '.join(s + '://' for s in SCHEMES)} (mqtts and ssl use TLS)")
            raise MqttConfigError(msg)
        if not parts.hostname:
            msg = f"MQTT broker URL {shown!r} names no host; expected mqtt://host[:port]"
            raise MqttConfigError(msg)
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            msg = f"MQTT broker URL {shown!r}: a path or query is not used; topics are given apart"
            raise MqttConfigError(msg)
        tls, default_port = SCHEMES[scheme]
        return cls(url=url, host=parts.hostname, port=port or default_port, tls=tls,
                   username=unquote(parts.username) if parts.username is not None else None,
                   password=unquote(parts.password) if parts.password is not None else None)

    @property
    def masked(self) -> str:
        """The URL with its password replaced by ``***`` (for logs and errors)."""
        return mask_url(self.url)


def check_topic_filter(topic: str) -> None:
    """Refuse a filter the broker would refuse (empty, misplaced wildcard), with the reason."""
    levels = topic.split("/")
    bad = (
        not topic
        or "\x00" in topic
        or any(("#" in lv and lv != "#") or ("+" in lv and lv != "+") for lv in levels)
        or "#" in levels[:-1]
    )
    if bad:
        msg = (f"MQTT topic filter {topic!r} is not valid: '+' must stand alone in its level and '#' alone in the "
               "last one (e.g. sensors/+/temp, sensors/#)")
        raise MqttConfigError(msg)


def check_tls(tls_ca: str | None, tls_cert: str | None, tls_key: str | None) -> None:
    """Refuse TLS files that cannot be used (a client certificate without its key or the other way
    round, a file that does not load), with the reason: checked when the source is made, before
    anything connects, as paho would only find out in ``open()``."""
    if (tls_cert is None) != (tls_key is None):
        msg = "MQTT TLS: give both a client certificate and its key, or neither"
        raise MqttConfigError(msg)
    if tls_ca is None and tls_cert is None:
        return
    try:
        context = ssl.create_default_context(cafile=tls_ca)
        if tls_cert is not None:
            context.load_cert_chain(tls_cert, tls_key)
    except (OSError, ssl.SSLError, ValueError) as exc:
        msg = f"MQTT TLS files do not load (CA {tls_ca!r}, certificate {tls_cert!r}, key {tls_key!r}): {exc}"
        raise MqttConfigError(msg) from exc


def _holding_client_class(mqtt: ModuleType) -> type[Client]:
    """paho's Client with QoS 2's PUBREC held until :meth:`release` (see the module notes)."""
    base: type[Client] = mqtt.Client
    needed = ("_handle_publish", "_handle_pubrel", "_send_pubrec", "_send_pubcomp", "_send_puback",
              "_handle_on_message")
    missing = [name for name in needed if not hasattr(base, name)]
    if missing:
        msg = (f"this paho-mqtt has no {', '.join(missing)}: QoS 2 cannot be held until persisted; "
               "install the version ftlayer[mqtt] pins, or use qos=1")
        raise MqttError(msg)

    class HoldingClient(base):  # type: ignore[misc,valid-type]
        """See the module notes: QoS 2 handed over on PUBLISH, PUBREC only in :meth:`release`."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._ftlayer_held: list[int] = []

        def _send_pubrec(self, mid: int) -> Any:  # paho calls it on a QoS 2 PUBLISH: hold it
            self._ftlayer_held.append(mid)
            return mqtt.MQTT_ERR_SUCCESS

        def _handle_publish(self) -> Any:
            rc = super()._handle_publish()
            held, self._ftlayer_held = self._ftlayer_held, []
            for mid in held:  # paho filed the message to deliver at PUBREL: deliver it now instead
                with self._in_message_mutex:
                    message = self._in_messages.pop(mid, None)
                if message is not None:
                    self._handle_on_message(message)
            return rc

        def _handle_pubrel(self) -> Any:
            mid = int.from_bytes(bytes(self._in_packet["packet"][:2]), "big")  # read before paho resets it
            rc = super()._handle_pubrel()  # manual ack: paho sends no PUBCOMP
            if rc != mqtt.MQTT_ERR_SUCCESS:
                return rc
            return self._send_pubcomp(mid)

        def release(self, mid: int, qos: int) -> Any:
            """ftlayer's acknowledgement: PUBACK (QoS 1) or the held PUBREC (QoS 2)."""
            if qos == 2:
                return base._send_pubrec(self, mid)
            return self._send_puback(mid) if qos == 1 else mqtt.MQTT_ERR_SUCCESS

    return HoldingClient


def make_client(address: BrokerAddress, *, client_id: str, protocol: str, tls_ca: str | None = None,
                tls_cert: str | None = None, tls_key: str | None = None) -> Any:
    """A paho client for ``address`` with manual acknowledgement, a persistent session (MQTT 3.1.1:
    clean session off; MQTT 5: ``clean_start=False`` is passed at connect) and TLS when the URL
    says so or a CA / client certificate is given. Its ``release(mid, qos)`` acknowledges."""
    mqtt = paho()
    if protocol not in PROTOCOLS:
        msg = f"MQTT protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}"
        raise MqttConfigError(msg)
    from paho.mqtt.enums import CallbackAPIVersion

    v5 = protocol == "5"
    cls = _holding_client_class(mqtt)
    kwargs: dict[str, Any] = {"callback_api_version": CallbackAPIVersion.VERSION2, "client_id": client_id,
                              "protocol": mqtt.MQTTv5 if v5 else mqtt.MQTTv311, "manual_ack": True}
    if not v5:
        kwargs["clean_session"] = False
    client = cls(**kwargs)
    if address.username is not None:
        client.username_pw_set(address.username, address.password)
    if address.tls or tls_ca or tls_cert:
        if (tls_cert is None) != (tls_key is None):
            msg = "MQTT TLS: give both a client certificate and its key, or neither"
            raise MqttConfigError(msg)
        try:
            client.tls_set(ca_certs=tls_ca, certfile=tls_cert, keyfile=tls_key, cert_reqs=ssl.CERT_REQUIRED)
        except (OSError, ssl.SSLError, ValueError) as exc:
            msg = f"MQTT TLS set-up for {address.masked} failed (CA {tls_ca!r}, certificate {tls_cert!r}): {exc}"
            raise MqttConfigError(msg) from exc
    return client

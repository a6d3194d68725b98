"""``ftlayer ingest ... --mqtt URL --topic FILTER``: an MQTT subscription persisted into a source.

::

    ftlayer ingest clicks events --mqtt mqtt://broker:1883 --topic 'sensors/#' --key device
    FTLAYER_INGEST_MQTT=mqtts://ingest:secret@broker ftlayer ingest clicks events --topic 'a/+/b' \\
        --shared-group clicks --client-id ingest-2 --key-topic

What it promises is :mod:`runtime.driver.mqtt`'s: a message is acknowledged to the broker only
once its record is persisted, so a process killed (kill -9 included) and started again with the
same ``--client-id`` gets every message it never acknowledged again from the broker's session;
nothing is lost, a message persisted and not yet acknowledged is persisted twice. SIGINT or
SIGTERM stops taking messages, persists and acknowledges what was taken, and exits 0.

Errors end in one ``ftlayer: error: ...`` line with exit status 2, before Redis is touched for a
bad option (URL, topic filter, QoS, options without ``--mqtt``), and before any record is read
for a broker that cannot be reached or refuses the client or the subscription.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.cli.common import CLIError
from runtime.cli.env import ingest_option
from runtime.driver.ingest import Ingestor
from runtime.driver.mqtt import MqttSource

# the options that only mean something with --mqtt, and the value each has when not given
MQTT_ONLY: dict[str, Any] = {"topic": None, "qos": "1", "client_id": None, "shared_group": None,
                             "key_topic": False, "topic_field": None, "mqtt_protocol": "5", "max_inflight": 1000,
                             "tls_ca": None, "tls_cert": None, "tls_key": None}
DEFAULT_TOPIC_FIELD = "topic"



def check_no_mqtt_options(args: argparse.Namespace) -> None:
    """Refuse an MQTT-only option (given, or set by its variable) without ``--mqtt``."""
    for dest, unset in MQTT_ONLY.items():
        if getattr(args, dest) != unset:
            opt = ingest_option(dest)
            msg = f"{opt.flag} is an MQTT option: it needs --mqtt URL (or unset {opt.env} if it comes from there)"
            raise CLIError(msg)


def default_client_id(config: FTConfig, topology: str, source: str) -> str:
    """A client id stable across restarts of the same ingest command (the session lives under it)."""
    return f"ftlayer-{config.namespace}-{topology}-{source}"


def mqtt_source(args: argparse.Namespace, config: FTConfig) -> MqttSource:
    """The :class:`MqttSource` the options describe (not connected yet); CLIError on a bad option."""
    if not args.topic:
        msg = "--mqtt needs at least one --topic FILTER (e.g. --topic 'sensors/#')"
        raise CLIError(msg)
    if args.key_topic and args.key:
        msg = "--key FIELD and --key-topic both name the key: give one"
        raise CLIError(msg)
    if args.shared_group and not args.client_id:
        msg = ("--shared-group needs --client-id: every ingest process of the group keeps its own session, "
               "and two with the same id would take it from each other")
        raise CLIError(msg)
    topic_field = args.topic_field or (DEFAULT_TOPIC_FIELD if args.key_topic else None)
    return MqttSource(
        args.mqtt, args.topic,
        client_id=args.client_id or default_client_id(config, args.topology, args.source),
        qos=int(args.qos), shared_group=args.shared_group, fmt=args.format, topic_field=topic_field,
        protocol=args.mqtt_protocol, max_inflight=args.max_inflight,
        tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
    )


def topic_key(source: MqttSource) -> Callable[[Any], Any]:
    """The key selector of ``--key-topic``: the topic the source added to each record."""
    field = source.topic_field or DEFAULT_TOPIC_FIELD

    def key(value: Any) -> Any:
        return value[field]  # an UnparsedMessage raises here: dead-lettered with the reason

    return key


def run_mqtt(source: MqttSource, layer: FTLayer, key: Any, *, run: Callable[..., int], check: Any = None) -> int:
    """Connect and subscribe (MqttConnectError, exit 2, if the broker will not have it), then ingest until
    SIGINT/SIGTERM; ``run`` is ``ftlayer ingest``'s loop with progress lines."""
    source.open()
    filters = ", ".join(source.filters)
    print(f"ftlayer ingest: {layer.keys.prefix} subscribed to {filters} on {source.address.masked} as client "
          f"{source.client_id!r} at QoS {source.qos} (session present: {source.session_present}); Ctrl-C or "
          "SIGTERM ends it", flush=True)

    ending = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        ending.set()  # ingest waiting (backpressure, Redis down) is then stopped too: ftlayer ingest's _run
        source.end()  # take no more; the source ends once what it took is persisted and acknowledged

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        return run(Ingestor(layer, source, key=key, check=check), ending=ending, source_label="mqtt", resumed={})
    finally:
        st = source.stats()
        print(f"ftlayer ingest: mqtt: received {st['received']}, acknowledged {st['acked']}, left to the broker "
              f"{st['stale']} (connection lost first), connections {st['connects']}", flush=True)
        source.close()

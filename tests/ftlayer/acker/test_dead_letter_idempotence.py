"""Dead-lettering is idempotent under client retries (real server; a real proxy loses replies)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from ftlayer.acker.replayer import REPLAY
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.ports import free_port
from runtime.driver.ingest import Ingestor
from serialization.serializers import make_record


class ReplyDropper:
    """A TCP proxy to a real server that, while dropping, forwards every request but throws the
    server's reply away and closes the client's connection: the command ran, the client never
    hears back, and redis-py (then ingest) retries it: a lost reply, for real."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._until = 0.0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_for(self, seconds: float) -> None:
        self._until = time.monotonic() + seconds

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while data := src.recv(65536):
                if replies and time.monotonic() < self._until:
                    self.dropped += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def dropper(redis_server_url: str) -> Iterator[ReplyDropper]:
    target = urlsplit(redis_server_url)
    proxy = ReplyDropper(target.hostname or "127.0.0.1", target.port or 6379)
    yield proxy
    proxy.close()


def test_a_retried_add_appends_one_dead_letter(layer: FTLayer) -> None:
    rec = make_record(layer, {"bad": 1}, channel=0)
    first = layer.dead_letters.add(rec, "key selector raised")
    again = layer.dead_letters.add(rec, "key selector raised")  # what a client retry sends
    assert again == first
    assert layer.dead_letters.count() == 1 and layer.stats()["dead_lettered"] == 1


def test_a_retried_replay_call_dead_letters_once(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer(max_replays=0)
    rec = make_record(layer, "poison")
    layer.persist([rec])
    layer.fail([rec.record_id.source_record_id], "poison")
    store, k = layer.store, layer.store.keys
    # ARGV: prefix, channels, no replays (chunks), no olds, the dead, now
    args = [k.prefix, layer.num_channels, b"", b"", struct.pack(">q", rec.record_id.source_record_id), store.now_ms()]
    replay_keys = [*store.state_keys, k.dlq, *store.channel_keys(layer.num_channels)]
    assert store.run(REPLAY, replay_keys, args) == [0, 1]
    assert store.run(REPLAY, replay_keys, args) == [0, 0]  # the retry finds nothing to move
    assert layer.dead_letters.count() == 1 and layer.stats()["dead_lettered"] == 1


@pytest.mark.slow
def test_ingest_rejects_a_record_once_when_its_replies_are_lost(
    ft_config: FTConfig, dropper: ReplyDropper
) -> None:
    parts = urlsplit(ft_config.redis_url)
    auth = f"{parts.username or ''}:{parts.password}@" if parts.password else ""
    cfg = ft_config.replace(redis_url=f"redis://{auth}127.0.0.1:{dropper.port}{parts.path}")
    layer = FTLayer(cfg, "ing", "src", num_channels=2).open()

    def key(value: Any) -> Any:
        if value == "bad-2":  # from the dead-lettering of this record on, replies are lost for 3 s
            dropper.drop_for(3.0)
        if isinstance(value, str):
            raise KeyError(value)
        return value

    ing = Ingestor(layer, ["bad-1", *range(10), "bad-2", *range(10, 20)], key=key)
    ing.run()
    letters = layer.dead_letters.list()
    print(f"\nreplies dropped: {dropper.dropped}; dead letters: {len(letters)}; rejected: {ing.rejected}")
    assert dropper.dropped >= 2  # redis-py's retry and ingest's retry both re-sent the call
    assert ing.error is None and ing.rejected == 2
    assert sorted(d.reason for d in letters) == [
        "ingest: key selector raised: KeyError: 'bad-1'", "ingest: key selector raised: KeyError: 'bad-2'",
    ]
    assert layer.stats()["dead_lettered"] == 2 and layer.pending_count() == 20

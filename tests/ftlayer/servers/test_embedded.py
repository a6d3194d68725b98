from __future__ import annotations

import socket
import sys

import pytest
import redis

from ftlayer.config import FTConfig, mask_url
from ftlayer.errors import EmbeddedServerError, RedisUnavailableError
from ftlayer.servers.embedded import EmbeddedServer
from ftlayer.servers.ports import free_port
from ftlayer.store.connection import client_for


def test_mask_url_hides_password() -> None:
    assert mask_url("redis://user:s3cret@host:6379/0") == "redis://user:***@host:6379/0"
    assert mask_url("rediss://:pw@h/1") == "rediss://:***@h/1"
    assert mask_url("redis://host:1") == "redis://host:1"


def test_unreachable_url_gives_one_clear_error_without_password() -> None:
    url = f"redis://bob:topsecret@127.0.0.1:{free_port()}/0"
    with pytest.raises(RedisUnavailableError) as err:
        client_for(url, connect_timeout_s=0.5)
    assert "bob:***@127.0.0.1" in str(err.value)
    assert "topsecret" not in str(err.value)


def test_embedded_server_has_aof_and_survives_kill_and_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = EmbeddedServer(data_dir=tmp_path, appendfsync="always").start()
    try:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("appendonly")["appendonly"] == "yes"
        client.set("k", "v")
        server.kill()
        server.restart()
        client = redis.Redis.from_url(server.url)
        assert client.get("k") == b"v"
    finally:
        server.stop()
    assert tmp_path.exists()  # a given data dir is kept


def test_password_protected_server_needs_the_password() -> None:
    with EmbeddedServer(password="pw-123") as server:
        assert client_for(server.url, 1.0).ping()
        wrong = server.url.replace("pw-123", "nope")
        with pytest.raises(RedisUnavailableError) as err:
            client_for(wrong, 1.0)
        assert "nope" not in str(err.value)


def test_no_url_starts_the_embedded_server() -> None:
    from ftlayer.servers.process_server import connect, embedded_server

    cfg = FTConfig()
    assert connect(cfg).ping()
    assert embedded_server(cfg).pid is not None


def test_server_restarted_from_a_short_lived_thread_outlives_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # PR_SET_PDEATHSIG is tied to the forking thread: a restart done by a fault injector's
    # thread must not kill the server when that thread ends
    import threading
    import time

    server = EmbeddedServer(data_dir=tmp_path / "d").start()
    try:
        def bounce() -> None:
            server.kill()
            server.restart()

        worker = threading.Thread(target=bounce)
        worker.start()
        worker.join()
        time.sleep(0.5)  # a SIGTERM from the parent-death signal would have landed by now
        assert redis.Redis.from_url(server.url).ping()
    finally:
        server.stop()


def test_free_port_stays_below_the_ephemeral_range() -> None:
    """A killed server restarts on its port: the port must not be one the kernel hands to client sockets."""
    import socket
    from pathlib import Path

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(10_000 <= p < low for p in ports), ports
    assert len(ports) > 1  # drawn at random, so two servers started together rarely meet
    # a client connection's own local port is ephemeral: it can never be one of ours
    with socket.socket() as server, socket.socket() as client:
        port = free_port()
        server.bind(("127.0.0.1", port))
        server.listen()
        client.connect(("127.0.0.1", port))
        assert client.getsockname()[1] >= low


def _held_port() -> socket.socket:
    """A port another process could have bound between free_port() and the server's own bind."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    return sock


def test_a_drawn_port_taken_before_the_server_binds_is_drawn_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The race of ci38: a node's drawn bus port bound by another test worker first. The server
    exits ("Address already in use"); a first start draws new ports and starts again."""
    with _held_port() as taken, _held_port() as taken_bus:
        server = EmbeddedServer(data_dir=tmp_path, cluster_bus_port=taken_bus.getsockname()[1],
                                extra_args=("--cluster-enabled", "yes"))
        server.port = taken.getsockname()[1]  # as if drawn, then taken: both of its ports are busy
        try:
            server.start()
            assert server.port != taken.getsockname()[1]
            assert server.cluster_bus_port != taken_bus.getsockname()[1]
            with redis.Redis(port=server.port) as client:
                assert client.ping()
                assert client.config_get("cluster-port")["cluster-port"] == str(server.cluster_bus_port)
        finally:
            server.stop()


def test_a_given_port_that_is_taken_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with _held_port() as taken:
        port = taken.getsockname()[1]
        server = EmbeddedServer(data_dir=tmp_path, port=port)
        with pytest.raises(EmbeddedServerError, match=f"(?s)port {port} exited with code .* Address already in use"):
            server.start()
        assert server.port == port and server.pid is None


def test_a_drawn_port_that_another_valkey_took_is_not_taken_for_ours(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The other process on the port answers PING too: the start must not take it for its own server."""
    with EmbeddedServer(data_dir=tmp_path / "a") as first:
        second = EmbeddedServer(data_dir=tmp_path / "b")
        second.port = first.port  # as if drawn by two workers at once
        try:
            second.start()
            assert second.port != first.port and second.pid is not None
            with redis.Redis(port=second.port) as client:
                assert client.info("server")["process_id"] == second.pid
        finally:
            second.stop()


def test_a_first_start_killed_before_it_logged_is_started_again(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """ci50: a server died of SIGABRT at start before writing its log (cause unknown). A stand-in
    binary aborts its first start the same way, then runs the real server: the start succeeds."""
    import ftlayer.servers.embedded as embedded

    real, marker = embedded.find_server_binary(), tmp_path / "aborted-once"
    stand_in = tmp_path / "valkey-server"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import os, signal, sys\n"
        f"if not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    os.kill(os.getpid(), signal.SIGABRT)\n"
        f"os.execv({str(real)!r}, [{str(real)!r}, *sys.argv[1:]])\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(embedded, "find_server_binary", lambda: stand_in)
    server = EmbeddedServer(data_dir=tmp_path / "data")
    try:
        server.start()
        assert marker.exists()  # the first start was killed
        with redis.Redis(port=server.port) as client:
            assert client.ping()
    finally:
        server.stop()

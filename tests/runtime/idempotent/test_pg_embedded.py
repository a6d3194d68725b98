"""EmbeddedPostgres: a real server from the distribution's binaries."""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

import psycopg
import pytest

from runtime.idempotent import pg_embedded
from runtime.idempotent.pg_embedded import EmbeddedPostgres, PostgresServerError


def test_server_starts_and_answers(postgres: EmbeddedPostgres) -> None:
    with psycopg.connect(postgres.url) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
        assert version is not None and int(version[0]) >= 120000
        fsync = conn.execute("SHOW fsync").fetchone()
        assert fsync == ("on",)  # fast, but honest: commits are durable
        addr = conn.execute("SELECT host(inet_server_addr())").fetchone()
        assert addr == ("127.0.0.1",)
    assert postgres.pid is not None
    if os.geteuid() == 0:  # postgres refuses root: it runs as an unprivileged user
        owner = pwd.getpwuid(postgres.data_dir.stat().st_uid).pw_name
        assert owner in ("postgres", "nobody")


def test_missing_binaries_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_embedded.shutil, "which", lambda name: None)
    monkeypatch.setattr(pg_embedded.glob, "glob", lambda pattern: [])
    with pytest.raises(PostgresServerError, match="apt-get install postgresql"):
        EmbeddedPostgres()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another user")
def test_directory_the_server_user_cannot_enter_is_refused() -> None:
    with tempfile.TemporaryDirectory() as private:  # 0700, owned by root
        server = EmbeddedPostgres(Path(private) / "pg")
        with pytest.raises(PostgresServerError, match="not writable by user"):
            server.start()


@pytest.mark.slow
def test_kill9_and_restart_keep_committed_rows() -> None:
    with EmbeddedPostgres() as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE crash (n int)")
            conn.execute("INSERT INTO crash VALUES (1), (2)")
        port = server.port
        server.kill9()
        assert server.pid is None
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.url, connect_timeout=2)
        server.restart()  # crash recovery replays the WAL
        assert server.port == port
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT count(*) FROM crash").fetchone() == (2,)
        directory = server.directory
    assert not directory.exists()  # a temporary directory goes with stop()


@pytest.mark.slow
def test_a_drawn_port_another_server_took_is_drawn_again(postgres: EmbeddedPostgres) -> None:
    """Two test workers drew the same port: the other server answers on it (trust auth, SELECT 1
    works) while this one exits on "Address already in use". The start must not take the other
    for its own, and draws a new port."""
    with tempfile.TemporaryDirectory() as parent:
        os.chmod(parent, 0o755)  # the server's user must reach its directory inside
        second = EmbeddedPostgres(Path(parent) / "pg")
        second.port = postgres.port  # as if drawn, then taken
        try:
            second.start()
            assert second.port != postgres.port and second.pid is not None
            with psycopg.connect(second.url) as conn:
                data_dir = conn.execute("SHOW data_directory").fetchone()
            assert data_dir == (str(second.data_dir),)
        finally:
            second.stop()

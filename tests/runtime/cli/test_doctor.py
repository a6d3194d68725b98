"""``ftlayer doctor`` against real servers (a single valkey-server, ACL users, the test cluster) and the
real Spark side, with no JVM started (tests/conftest.py fails a test that starts one unmarked)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.servers.embedded import EmbeddedServer
from runtime.cli.main import main

ADMIN = "doctor-admin-PW"


def _doctor(capsys: Any, *argv: str) -> tuple[int, dict[str, Any], str]:
    """``ftlayer doctor -o json ARGV``: (exit code, {check name: check}, stderr)."""
    try:
        code = main(["doctor", "-o", "json", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    doc = json.loads(out)
    assert doc["ok"] is (code == 0)
    return code, {c["name"]: c for c in doc["checks"]}, err


@pytest.fixture(scope="module")
def own_server() -> Iterator[EmbeddedServer]:
    """A server whose settings the tests change (not the shared one)."""
    server = EmbeddedServer(password=ADMIN).start()
    yield server
    server.stop()


@pytest.fixture
def admin(own_server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(own_server.url)
    yield client
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("appendonly", "yes")
    client.close()


def _user_url(server: EmbeddedServer, admin: redis.Redis, *rules: str) -> str:
    name = "u" + uuid.uuid4().hex[:8]
    admin.execute_command("ACL", "SETUSER", name, "on", ">pw", "resetchannels", *rules)  # type: ignore[no-untyped-call]
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"


def test_a_good_server_passes_and_nothing_is_written(capsys: Any, redis_server_url: str, namespace: str) -> None:
    client = redis.Redis.from_url(redis_server_url)
    code, checks, _ = _doctor(capsys, "--redis-url", redis_server_url, "--namespace", namespace)
    assert code == 0
    assert checks["version"]["status"] == "ok" and checks["version"]["detail"].startswith("Valkey ")
    assert checks["maxmemory-policy"]["detail"].startswith("noeviction")
    assert checks["AOF"]["status"] == "ok" and "appendonly yes" in checks["AOF"]["detail"]
    assert checks["ACL rights"]["status"] == "ok" and checks["cluster"]["status"] == "skip"
    assert checks["pyspark"]["status"] == "ok" and checks["java"]["status"] == "ok"
    assert list(client.scan_iter(match=f"{namespace}:*")) == []  # the ACL probe ran nothing
    client.close()


def test_eviction_policy_and_aof_are_checked_against_the_durability(
    capsys: Any, own_server: EmbeddedServer, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin.config_set("maxmemory-policy", "allkeys-lru")
    code, checks, _ = _doctor(capsys, "--redis-url", own_server.url, "--only", "server")
    assert code == 1 and checks["maxmemory-policy"]["status"] == "fail"
    assert "allkeys-lru" in checks["maxmemory-policy"]["detail"] and "CONFIG SET maxmemory-policy noeviction" in (
        checks["maxmemory-policy"]["detail"])
    assert ADMIN not in json.dumps(checks)  # the URL is masked
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("appendonly", "no")
    code, checks, _ = _doctor(capsys, "--redis-url", own_server.url, "--only", "server")
    assert code == 0 and checks["AOF"]["status"] == "warn" and "appendonly no" in checks["AOF"]["detail"]
    monkeypatch.setenv("FTLAYER_DURABILITY", "waitaof")
    code, checks, _ = _doctor(capsys, "--redis-url", own_server.url, "--only", "server")
    assert code == 1 and checks["AOF"]["status"] == "fail" and "'waitaof' needs appendonly yes" in checks["AOF"][
        "detail"]
    monkeypatch.setenv("FTLAYER_DURABILITY", "replicated")
    code, checks, _ = _doctor(capsys, "--redis-url", own_server.url, "--only", "server")
    assert code == 1 and checks["replication"]["status"] == "fail" and "0 connected replica" in checks[
        "replication"]["detail"]


def test_acl_rights_are_probed_for_the_namespace(
    capsys: Any, own_server: EmbeddedServer, admin: redis.Redis
) -> None:
    ns = "acl" + uuid.uuid4().hex[:6]
    documented = _user_url(own_server, admin, f"~{ns}:*", "+@all", "-@dangerous")  # docs/operations.md's user
    code, checks, _ = _doctor(capsys, "--redis-url", documented, "--namespace", ns, "--only", "server")
    assert code == 0 and checks["ACL rights"]["status"] == "warn"  # INFO and CONFIG GET are @dangerous: optional
    assert "not allowed: INFO, CONFIG GET" in checks["ACL rights"]["detail"] and checks["version"]["status"] == "warn"
    no_xadd = _user_url(own_server, admin, f"~{ns}:*", "+@all", "-@dangerous", "-xadd")
    code, checks, _ = _doctor(capsys, "--redis-url", no_xadd, "--namespace", ns, "--only", "server")
    assert code == 1 and checks["ACL rights"]["status"] == "fail" and "XADD" in checks["ACL rights"]["detail"]
    elsewhere = _user_url(own_server, admin, "~other:*", "+@all", "-@dangerous")
    code, checks, _ = _doctor(capsys, "--redis-url", elsewhere, "--namespace", ns, "--only", "server")
    assert code == 1 and "No permissions to access a key" in checks["ACL rights"]["detail"]
    assert admin.keys("*") == []  # nothing ran: probes are queued in MULTI and discarded


def test_cluster_state_is_checked_on_a_cluster(capsys: Any, valkey_cluster: Any) -> None:
    code, checks, _ = _doctor(capsys, "--redis-url", valkey_cluster.urls[0], "--only", "server")
    assert code == 0, checks
    assert checks["cluster"]["status"] == "ok"
    assert checks["cluster"]["detail"] == "state ok, 16384/16384 slots ok, 3 primaries, 6 nodes"
    assert checks["ACL rights"]["status"] == "ok"  # a redirection (MOVED) comes after the ACL check
    assert checks["cluster nodes"] == {"section": "server", "name": "cluster nodes", "status": "ok",
                                       "detail": "maxmemory-policy and AOF as required on all 6 nodes"}


def test_every_cluster_node_is_checked_not_only_the_one_of_the_url(capsys: Any, valkey_cluster: Any) -> None:
    """A replica (it becomes the primary on a failover) that may evict: doctor names it, though the
    URL names another node whose own settings are fine."""
    url = valkey_cluster.urls[0]
    nodes = [redis.Redis.from_url(u) for u in valkey_cluster.urls]
    replica = next(n for n in nodes if n.info("replication")["role"] == "slave")
    port = replica.connection_pool.connection_kwargs["port"]
    assert f":{port}/" not in url
    replica.config_set("maxmemory-policy", "allkeys-lru")
    try:
        code, checks, _ = _doctor(capsys, "--redis-url", url, "--only", "server")
    finally:
        replica.config_set("maxmemory-policy", "noeviction")
        for n in nodes:
            n.close()
    assert code == 1 and checks["maxmemory-policy"]["status"] == "ok"  # the URL's node is fine
    detail = checks["cluster nodes"]["detail"]
    assert checks["cluster nodes"]["status"] == "fail" and f":{port} (replica) maxmemory-policy" in detail
    assert "allkeys-lru" in detail


def test_unreachable_or_unconfigured_server(capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    code, checks, _ = _doctor(capsys, "--redis-url", "redis://u:secret-pw@127.0.0.1:1/0", "--only", "server")
    assert code == 1 and checks["reachable"]["status"] == "fail" and "cannot reach Redis" in checks["reachable"][
        "detail"]
    assert "secret-pw" not in json.dumps(checks)
    monkeypatch.delenv("FTLAYER_REDIS_URL", raising=False)
    code, checks, _ = _doctor(capsys, "--redis-url", "", "--only", "server")
    assert code == 0 and list(checks) == ["reachable"] and checks["reachable"]["status"] == "skip"


def _fake_java(tmp_path: Path, version: str) -> Path:
    home = tmp_path / f"jdk-{version}"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f'#!/bin/sh\necho \'openjdk version "{version}" 2024-01-16\' >&2\n')
    java.chmod(0o755)
    return home


def test_java_and_pyspark_are_checked_without_starting_a_jvm(
    capsys: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, "11.0.22")))
    code, checks, _ = _doctor(capsys, "--only", "spark")
    assert code == 1 and checks["java"]["status"] == "fail" and "11.0.22" in checks["java"]["detail"]
    assert "needs Java 17" in checks["java"]["detail"]
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, "21.0.2")))
    code, checks, _ = _doctor(capsys, "--only", "spark")
    assert code == 0 and checks["java"]["detail"].startswith("21.0.2")
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on PATH
    code, checks, _ = _doctor(capsys, "--only", "spark")
    assert code == 1 and "no java on PATH" in checks["java"]["detail"]
    monkeypatch.setitem(__import__("sys").modules, "pyspark", None)  # as if not installed
    code, checks, _ = _doctor(capsys, "--only", "spark")
    assert checks["pyspark"]["status"] == "fail" and "pip install 'ftlayer[spark]'" in checks["pyspark"]["detail"]
    assert os.environ["PATH"] == str(tmp_path)


def test_table_output(capsys: Any, redis_server_url: str) -> None:
    code = main(["doctor", "--redis-url", redis_server_url])
    out = capsys.readouterr().out
    assert code == 0 and out.splitlines()[1].split() == ["SECTION", "CHECK", "STATUS", "DETAIL"]
    assert "maxmemory-policy  OK" in out and out.rstrip().endswith("all checks passed")

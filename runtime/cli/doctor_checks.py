"""The checks of ``ftlayer doctor``: one :class:`Check` per question, never an exception.

Server side (:func:`server_checks`, against the configured ``redis_url``; read-only):
reachable; version (Valkey, or Redis >= 7.0: the scripts declare their keys with ``#!lua``
flags); ``maxmemory-policy`` (must be ``noeviction``, see ``ftlayer.store.server_settings`` and
docs/operations.md); AOF against the configured ``durability``; replication where the
durability mode needs a replica; the ACL rights for every command ftlayer sends on the
namespace's keys (:func:`ftlayer.store.server_commands.probe_permissions`: nothing runs); and, on a
cluster, its state and, on every node it lists (primaries and replicas: a replica becomes the
primary on a failover), ``maxmemory-policy`` and AOF as above (one check, ``cluster nodes``,
naming each node that fails; a node that cannot be reached or queried is a warning). The other
settings are read from the node the URL names.

Spark side (:func:`spark_checks`; no JVM is started): pyspark importable and >= 4.0, pandas and
pyarrow for the DataFrame path, and ``java`` (``$JAVA_HOME/bin/java``, else the one on PATH)
at version 17 or newer, read from ``java -version``.

Status: ``ok``; ``warn`` (works, but something is unchecked or weaker than it could be);
``fail`` (ftlayer refuses to run or breaks a promise); ``skip`` (does not apply).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import redis

from ftlayer.config import FTConfig, mask_url
from ftlayer.errors import FTLayerError
from ftlayer.store.connection import client_for
from ftlayer.store.server_commands import COMMANDS, needed, probe_permissions
from ftlayer.store.server_settings import SAFE_POLICY

MIN_REDIS = (7, 0)
MIN_PYSPARK = (4, 0)
MIN_JAVA = 17


@dataclass(frozen=True)
class Check:
    """One answer of ``ftlayer doctor``."""

    section: str  # "server" or "spark"
    name: str
    status: str  # "ok", "warn", "fail" or "skip"
    detail: str


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _info(client: redis.Redis, section: str) -> dict[str, Any] | None:
    """``INFO section``, or None when the user may not run INFO."""
    try:
        return dict(client.info(section))
    except redis.exceptions.NoPermissionError:
        return None


def server_checks(config: FTConfig) -> list[Check]:
    """The server-side checks (see the module contract)."""
    if not config.redis_url:
        return [Check("server", "reachable", "skip",
                      "no redis_url configured (--redis-url, FTLAYER_REDIS_URL, ftlayer.toml): a job then starts "
                      "an embedded server, which works on local masters only")]
    url = mask_url(config.redis_url)
    try:
        client_for(config.redis_url, config.connect_timeout_s)
    except FTLayerError as exc:
        return [Check("server", "reachable", "fail", str(exc))]
    node = redis.Redis.from_url(config.redis_url, socket_connect_timeout=config.connect_timeout_s)
    try:
        checks = [Check("server", "reachable", "ok", url), *_settings(node, config), _acl(node, config),
                  _cluster(node, config)]
        if checks[-1].status not in ("skip", "warn"):  # a cluster: every node's settings
            checks.append(_cluster_nodes(node, config))
    except redis.RedisError as exc:
        return [Check("server", "reachable", "fail", f"Redis at {url} failed: {exc}")]
    else:
        return checks
    finally:
        node.close()


def _settings(node: redis.Redis, config: FTConfig) -> list[Check]:
    server, memory = _info(node, "server"), _info(node, "memory")
    persistence, replication = _info(node, "persistence"), _info(node, "replication")
    if server is None or memory is None or persistence is None or replication is None:
        why = "INFO is not allowed for this user: ftlayer skips its own checks of these settings at open too"
        return [Check("server", name, "warn", why) for name in ("version", "maxmemory-policy", "AOF", "replication")]
    return [_version_check(server), _policy_check(memory), _aof_check(node, persistence, config.durability),
            _replication_check(replication, config.durability)]


def _version_check(server: dict[str, Any]) -> Check:
    valkey = server.get("valkey_version")
    if valkey:
        return Check("server", "version", "ok", f"Valkey {valkey}")
    version = str(server.get("redis_version", "?"))
    if _version(version) >= MIN_REDIS:
        return Check("server", "version", "ok", f"Redis {version}")
    return Check("server", "version", "fail",
                 f"Redis {version}: ftlayer needs Redis >= {MIN_REDIS[0]}.{MIN_REDIS[1]} or Valkey (its scripts "
                 "declare their keys with #!lua flags)")


def _policy_check(memory: dict[str, Any]) -> Check:
    policy = str(memory.get("maxmemory_policy", "?"))
    limit = int(memory.get("maxmemory", 0) or 0)
    bound = f"maxmemory {limit} bytes" if limit else "maxmemory 0 (no limit)"
    if policy == SAFE_POLICY:
        return Check("server", "maxmemory-policy", "ok", f"{policy}, {bound}")
    return Check("server", "maxmemory-policy", "fail",
                 f"{policy}: the server may evict ftlayer's keys (pending records are then lost without a "
                 f"replay) and FTLayer.open() refuses it. Fix: CONFIG SET maxmemory-policy {SAFE_POLICY} (and in "
                 "the server's config file or parameter group)")


def _appendfsync(node: redis.Redis) -> str | None:
    try:
        got = node.config_get("appendfsync")
    except redis.ResponseError:  # CONFIG renamed or not allowed (managed servers)
        return None
    value = got.get("appendfsync")
    return value.decode() if isinstance(value, bytes) else value


def _aof_check(node: redis.Redis, persistence: dict[str, Any], durability: str) -> Check:
    on = int(persistence.get("aof_enabled", 0) or 0) == 1
    fsync = _appendfsync(node) if on else None
    state = f"appendonly {'yes' if on else 'no'}" + (f", appendfsync {fsync}" if fsync else "")
    if on and str(persistence.get("aof_last_write_status", "ok")) != "ok":
        return Check("server", "AOF", "fail", f"{state}; the last AOF write failed (aof_last_write_status "
                                             f"{persistence.get('aof_last_write_status')}): check the disk")
    if durability in ("waitaof", "replicated-aof"):
        if not on or fsync == "no":
            return Check("server", "AOF", "fail", f"{state}: durability = {durability!r} needs appendonly yes and "
                                                  "an appendfsync other than no (FTLayer.open() refuses it)")
        return Check("server", "AOF", "ok" if fsync else "warn",
                     state if fsync else f"{state}; appendfsync unknown (CONFIG GET not allowed)")
    if not on and durability == "everysec":
        return Check("server", "AOF", "warn", f"{state}: a server crash loses every persist since the last RDB "
                                              "snapshot, not ~1 s (durability 'everysec' assumes AOF on)")
    return Check("server", "AOF", "ok", f"{state} (durability {durability!r})")


def _replication_check(replication: dict[str, Any], durability: str) -> Check:
    role = str(replication.get("role", "?"))
    replicas = int(replication.get("connected_slaves", 0) or 0)
    state = f"{role} with {replicas} connected replica(s)"
    if durability in ("replicated", "replicated-aof") and (role != "master" or replicas < 1):
        return Check("server", "replication", "fail",
                     f"{state}: durability = {durability!r} needs a primary with a connected replica")
    return Check("server", "replication", "ok", f"{state} (durability {durability!r})")


def _acl(node: redis.Redis, config: FTConfig) -> Check:
    try:
        denied = {name: why for name, why in probe_permissions(node, config.namespace).items() if why}
    except redis.ResponseError as exc:  # MULTI itself refused
        return Check("server", "ACL rights", "warn", f"cannot probe the user's rights: {exc}")
    if not denied:
        return Check("server", "ACL rights", "ok",
                     f"the user may run all {len(COMMANDS)} commands ftlayer sends on {config.namespace}:* keys")
    must = [u.name for u in COMMANDS if u.name in denied and needed(u, config.durability)]
    may = [u.name for u in COMMANDS if u.name in denied and not needed(u, config.durability)]
    if must:
        first = denied[must[0]]
        return Check("server", "ACL rights", "fail",
                     f"denied on {config.namespace}:* keys: {', '.join(must)} ({first}); "
                     f"ftlayer needs them: e.g. ACL SETUSER <user> ~{config.namespace}:* +@all -@dangerous")
    return Check("server", "ACL rights", "warn",
                 f"all needed commands allowed; not allowed: {', '.join(may)} (ftlayer copes: it checks or shows less)")


def _cluster(node: redis.Redis, config: FTConfig) -> Check:
    enabled = _info(node, "cluster")
    if enabled is None:
        return Check("server", "cluster", "warn", "INFO not allowed: cannot tell whether this is a cluster")
    if int(enabled.get("cluster_enabled", 0) or 0) != 1:
        return Check("server", "cluster", "skip", "not a cluster")
    raw = node.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    state, slots = info.get("cluster_state", "?"), info.get("cluster_slots_ok", "?")
    size, nodes = int(info.get("cluster_size", 0)), int(info.get("cluster_known_nodes", 0))
    detail = f"state {state}, {slots}/16384 slots ok, {size} primaries, {nodes} nodes"
    if state != "ok" or slots != "16384":
        return Check("server", "cluster", "fail", f"{detail}: scripts on slots not served fail (CLUSTERDOWN)")
    if config.durability in ("replicated", "replicated-aof") and nodes <= size:
        return Check("server", "cluster", "fail", f"{detail}: durability {config.durability!r} needs replicas")
    return Check("server", "cluster", "ok", detail)


def _cluster_nodes(node: redis.Redis, config: FTConfig) -> Check:
    """``maxmemory-policy`` and AOF on every node ``CLUSTER NODES`` lists (see the module contract)."""
    raw = node.execute_command("CLUSTER", "NODES")  # type: ignore[no-untyped-call]
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    addresses: list[tuple[str, int, str]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3 or "fail" in parts[2].split(",") or "noaddr" in parts[2]:
            continue
        host, _, port_text = parts[1].split("@", 1)[0].rpartition(":")
        role = "primary" if "master" in parts[2] else "replica"
        addresses.append((host.strip("[]") or "127.0.0.1", int(port_text), role))
    kwargs = node.connection_pool.connection_kwargs
    failed: list[str] = []
    unchecked: list[str] = []
    for host, port, role in sorted(addresses):
        where = f"{host}:{port} ({role})"
        peer = redis.Redis(host=host, port=port, username=kwargs.get("username"), password=kwargs.get("password"),
                           socket_connect_timeout=config.connect_timeout_s, socket_timeout=config.connect_timeout_s)
        try:
            memory, persistence = _info(peer, "memory"), _info(peer, "persistence")
            if memory is None or persistence is None:
                unchecked.append(f"{where}: INFO not allowed")
                continue
            for check in (_policy_check(memory), _aof_check(peer, persistence, config.durability)):
                if check.status == "fail":
                    failed.append(f"{where} {check.name}: {check.detail}")
        except redis.RedisError as exc:
            unchecked.append(f"{where}: {exc}")
        finally:
            peer.close()
    if failed:
        return Check("server", "cluster nodes", "fail", "; ".join(failed))
    if unchecked:
        return Check("server", "cluster nodes", "warn", "not checked: " + "; ".join(unchecked))
    return Check("server", "cluster nodes", "ok",
                 f"maxmemory-policy and AOF as required on all {len(addresses)} nodes")


def spark_checks() -> list[Check]:
    """The Spark-side checks (see the module contract); no JVM is started."""
    return [_pyspark(), _python_deps(), _java()]


def _pyspark() -> Check:
    try:
        pyspark = importlib.import_module("pyspark")
    except ImportError as exc:
        return Check("spark", "pyspark", "fail", f"not importable ({exc}): pip install 'ftlayer[spark]'")
    version = str(getattr(pyspark, "__version__", "?"))
    if _version(version) >= MIN_PYSPARK:
        return Check("spark", "pyspark", "ok", f"{version} ({os.path.dirname(pyspark.__file__ or '')})")
    return Check("spark", "pyspark", "fail", f"{version}: ftlayer needs pyspark >= 4.0 (Python data sources)")


def _python_deps() -> Check:
    found, missing = [], []
    for name in ("pandas", "pyarrow"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        return Check("spark", "pandas, pyarrow", "warn", f"missing {', '.join(missing)}: the DataFrame path "
                                                         "(read_stream, ftlayer.udf) needs them (ftlayer[spark])")
    return Check("spark", "pandas, pyarrow", "ok", ", ".join(found))


def _java() -> Check:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    where = "$JAVA_HOME/bin/java" if home else "java on PATH"
    if not java or not os.access(java, os.X_OK):
        return Check("spark", "java", "fail", f"no {where}: Spark 4 needs Java {MIN_JAVA} or 21 "
                                              "(Debian: apt-get install openjdk-17-jre-headless)")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("spark", "java", "fail", f"{java} -version failed: {exc}")
    match = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
    if match is None:
        return Check("spark", "java", "warn", f"{java}: cannot read its version from 'java -version'")
    text = match.group(1)
    major = _version(text)[0] if not text.startswith("1.") else _version(text)[1]
    status = "ok" if major >= MIN_JAVA else "fail"
    need = "" if status == "ok" else f": Spark 4 needs Java {MIN_JAVA} or 21"
    return Check("spark", "java", status, f"{text} ({java}){need}")

"""Server settings that ftlayer depends on, checked once when a source is opened.

Contract of :func:`check_server_settings` (called by ``FTLayer.open()`` before
anything is written):

- **Eviction.** ``maxmemory-policy`` must be ``noeviction``. Any other policy
  lets the server delete keys when it reaches ``maxmemory``: the ``allkeys-*``
  policies pick pending records, channel streams or dead letters, which then
  vanish without a failure or a replay (the issue reproduced 100,000 pending
  records lost with ``allkeys-lru``). The ``volatile-*`` policies only evict
  keys with a TTL, and ftlayer sets TTLs on its flush tokens (``tok:*``) and
  its rotator lease: an evicted token turns a retried flush into a double
  application (the record is then delayed into a timeout and replayed), an
  evicted lease lets a second driver rotate early. Neither loses a record,
  but both break documented promises, so they are refused too. Raises
  :class:`~ftlayer.errors.EvictionPolicyError`. With ``noeviction`` a full
  server refuses writes with an OOM error instead, which ftlayer reports
  (an ``AckerError`` naming it) and ingest retries.
- **replicated.** With ``durability = "replicated"`` or ``"replicated-aof"``
  the server that owns the source must be a primary with a connected replica,
  else every WAIT would time out. Raises :class:`~ftlayer.errors.DurabilityError`.
  (Whether the replicas run with AOF, as ``"replicated-aof"`` needs, shows
  only when a WAITAOF times out.)
- **waitaof.** With ``durability = "waitaof"`` (or ``"replicated-aof"``) the server must have AOF on
  (``appendonly yes``), else every WAITAOF would be refused; and it must not
  run ``appendfsync no``, under which WAITAOF never confirms a local fsync.
  Raises :class:`~ftlayer.errors.DurabilityError`. The other modes promise
  nothing the server could refuse at open (see docs/guarantees.md).

Settings are read with ``INFO`` (available on managed servers that rename or
block ``CONFIG``); ``appendfsync`` is only in ``CONFIG GET``, so it is checked
when that command is allowed and skipped otherwise. A server that answers
neither is let through with a warning: ftlayer cannot tell.
"""

from __future__ import annotations

import logging

import redis

from ftlayer.errors import DurabilityError, EvictionPolicyError

log = logging.getLogger(__name__)

SAFE_POLICY = "noeviction"


def _info(client: redis.Redis, section: str) -> dict[str, object]:
    try:
        return dict(client.info(section))
    except redis.ResponseError as exc:  # INFO blocked by an ACL
        log.warning("cannot read INFO %s (%s): ftlayer cannot check the server's settings", section, exc)
        return {}


def _config(client: redis.Redis, name: str) -> str | None:
    try:
        got = client.config_get(name)
    except redis.ResponseError:  # CONFIG renamed or blocked (managed servers)
        return None
    value = got.get(name)
    return value.decode() if isinstance(value, bytes) else value


def check_eviction_policy(client: redis.Redis, where: str) -> None:
    """Raise :class:`EvictionPolicyError` unless ``maxmemory-policy`` is ``noeviction``."""
    policy = _info(client, "memory").get("maxmemory_policy")
    if policy is None:
        return
    policy = str(policy)
    if policy != SAFE_POLICY:
        msg = (
            f"{where}: the Redis server runs with maxmemory-policy {policy}, which lets it evict "
            f"ftlayer keys (pending records, channel streams, flush tokens) when memory is full, and "
            f"evicted records are lost without a replay. Set it to {SAFE_POLICY}: "
            f"'CONFIG SET maxmemory-policy {SAFE_POLICY}' (and 'maxmemory-policy {SAFE_POLICY}' in "
            f"the server's config file or parameter group), or use a server of its own for ftlayer"
        )
        raise EvictionPolicyError(msg)


def check_waitaof_supported(client: redis.Redis, where: str) -> None:
    """Raise :class:`DurabilityError` if WAITAOF can never confirm a local fsync on this server."""
    enabled = _info(client, "persistence").get("aof_enabled")
    if enabled is not None and int(str(enabled)) != 1:
        msg = (
            f'{where}: durability = "waitaof" needs the server\'s AOF, but it runs with appendonly no. '
            f"Turn it on ('CONFIG SET appendonly yes' and 'appendonly yes' in its config file) or "
            f'choose durability = "everysec" or "none"'
        )
        raise DurabilityError(msg)
    if _config(client, "appendfsync") == "no":
        msg = (
            f'{where}: durability = "waitaof" cannot work with appendfsync no: the server never '
            f"confirms a local fsync, so every persist would time out. Use 'CONFIG SET appendfsync "
            f"always' (or everysec) or choose another durability mode"
        )
        raise DurabilityError(msg)


def check_server_settings(client: redis.Redis, durability: str, where: str) -> None:
    """Check eviction and, in 'waitaof' mode, AOF settings (see the module contract)."""
    check_eviction_policy(client, where)
    if durability in ("waitaof", "replicated-aof"):
        check_waitaof_supported(client, where)
    if durability in ("replicated", "replicated-aof"):
        check_replicated(client, durability, where)


def check_replicated(client: redis.Redis, durability: str, where: str) -> None:
    """Refuse a server that cannot confirm replication: not a primary, or no replica connected."""
    info = _info(client, "replication")
    if not info:
        log.warning("%s: cannot read INFO replication; durability = %r unchecked", where, durability)
        return
    replicas = int(str(info.get("connected_slaves", 0)))
    if info.get("role") != "master" or replicas < 1:
        msg = (
            f"{where}: durability = {durability!r} needs a primary with at least one connected replica, "
            f"but the server that owns the source is a {info.get('role')} with {replicas} connected "
            f"replicas; add a replica (or a Valkey/Redis Cluster with replicas) or choose "
            f'durability = "waitaof", "everysec" or "none"'
        )
        raise DurabilityError(msg)

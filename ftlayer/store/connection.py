"""Connecting to Redis: a client per URL and process.

``client_for(url)`` returns a cached client per URL and process (redis-py pools
reset themselves after fork). A config that names no URL is resolved first, to
the process's embedded server (``ftlayer.servers.process_server``): nothing here
starts a server.

Cluster: a URL naming any node of a Redis or Valkey Cluster (the server reports
``cluster_enabled:1``) gets redis-py's ``RedisCluster``, found out once per client
with ``INFO cluster``. It follows MOVED and ASK redirections and refreshes its
slot map itself; every key of one source shares one hash tag, so each script
runs on the one node that owns the source (see :mod:`ftlayer.keyspace.keys`). It has the
same command methods ftlayer uses, so it is handed out typed as ``redis.Redis``;
:func:`is_cluster` tells them apart where it matters (durability waits must run
on the owning node's connection, see ``SourceStore.run_durable``). Every connection failure is
raised as one :class:`~ftlayer.errors.RedisUnavailableError` naming the URL
with its password masked.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError
from redis.retry import Retry

from ftlayer.config.redis_url import mask_url
from ftlayer.errors import RedisUnavailableError
from ftlayer.store.outage import OutageRetry

T = TypeVar("T")
log = logging.getLogger(__name__)

_lock = threading.Lock()
_clients: dict[tuple[int, str, float, float], redis.Redis] = {}


def client_for(
    url: str, connect_timeout_s: float = 5.0, *, check: bool = True, outage_budget_s: float = 0.0
) -> redis.Redis:
    """A cached redis-py client for ``url`` in this process; PINGs it once when created.

    Connection errors and timeouts are retried three times with backoff by
    redis-py, or, with ``outage_budget_s`` > 0, for up to that many seconds
    (:class:`~ftlayer.store.outage.OutageRetry`). That is safe because every ftlayer
    script is idempotent (persist skips known ids, flushes carry tokens, fails
    and replays check state).
    """
    key = (os.getpid(), url, connect_timeout_s, outage_budget_s)
    with _lock:
        client = _clients.get(key)
    if client is not None:
        return client
    def retry() -> Retry:
        if outage_budget_s > 0:
            return OutageRetry(outage_budget_s)
        return Retry(ExponentialBackoff(cap=1.0, base=0.05), 3)

    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout_s,
            socket_keepalive=True,
            health_check_interval=30,
            retry=retry(),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )
        if check:
            client.ping()
        if check and _cluster_enabled(client):  # check=False: no round trip, so a plain client
            client.close()
            # count-based on purpose: RedisCluster makes 1 + get_retries() attempts, and
            # OutageRetry's -1 would make none; SourceStore.run rides out failovers itself
            client = cast(redis.Redis, redis.RedisCluster.from_url(
                url,
                socket_connect_timeout=connect_timeout_s,
                socket_keepalive=True,
                health_check_interval=30,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
            ))
    except redis.RedisError as exc:
        msg = _connect_error(url, exc)
        raise RedisUnavailableError(msg) from exc
    except (OSError, ValueError) as exc:
        msg = f"cannot reach Redis at {mask_url(url)}: {exc}"
        raise RedisUnavailableError(msg) from exc
    with _lock:
        _clients[key] = client
    return client


def _cluster_enabled(client: redis.Redis) -> bool:
    """True if the server is a node of a Redis/Valkey Cluster (``INFO cluster``)."""
    try:
        info = client.info("cluster")
    except redis.ResponseError:  # a server or proxy without the section
        return False
    return bool(int(info.get("cluster_enabled", 0)))


def is_cluster(client: redis.Redis) -> bool:
    """True if ``client`` is a cluster client (``redis.RedisCluster``)."""
    return isinstance(client, redis.RedisCluster)


#: Least time a call on a cluster keeps retrying through a failover or a slot migration.
CLUSTER_RIDE_OUT_S = 30.0
CLUSTER_TRANSIENT: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError, SlotNotCoveredError,
)


def refresh_slots(client: redis.Redis) -> None:
    """After a node did not answer: let a cluster client re-read the slot map (a failover)."""
    if is_cluster(client):
        try:
            cast(redis.RedisCluster, client).nodes_manager.initialize()
        except redis.RedisError as exc:
            log.debug("slot map refresh failed: %s", exc)


def ride_out(client: redis.Redis, call: Callable[[], T], budget_s: float) -> T:
    """``call()``; on a cluster, retried through a failover or a slot migration.

    A failover (connections refused, then CLUSTERDOWN, then a new primary) or a slot migration
    (TRYAGAIN) takes seconds, and redis-py's cluster client gives up sooner; so on a cluster
    ``call`` is retried with backoff for ``budget_s`` or at least :data:`CLUSTER_RIDE_OUT_S`,
    re-reading the slot map after each failure. Only for idempotent calls. On a single server
    this is ``call()``: the client's own retry (``outage_budget_s``) rides out outages there.
    """
    if not is_cluster(client):
        return call()
    ride = OutageRetry(max(budget_s, CLUSTER_RIDE_OUT_S), errors=CLUSTER_TRANSIENT)
    return ride.call_with_retry(call, lambda _exc: refresh_slots(client))


def _connect_error(url: str, exc: redis.RedisError) -> str:
    """What went wrong connecting to ``url``, in words an operator can act on (password masked)."""
    shown = mask_url(url)
    text = str(exc)
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
        db = parts.path.lstrip("/") or "0"
    except ValueError:
        has_password, db = False, "?"
    if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in text or "HELLO must be called" in text:
        if not has_password:
            return (f"Redis at {shown} requires a password and the URL has none: use "
                    f"redis://:PASSWORD@host:port/db or redis://USER:PASSWORD@host:port/db")
        return f"Redis at {shown} refused the credentials (wrong user or password): {text}"
    if "DB index is out of range" in text:
        return (f"Redis at {shown} has no database {db}: the server's 'databases' setting allows fewer "
                f"(the default is 16: 0-15); pick another /db in the URL")
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach Redis at {shown}: {text}"
    return f"Redis at {shown} refused the connection set-up: {text}"

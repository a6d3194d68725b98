"""Connecting to Redis: a URL from config, or the embedded server when there is none.

``redis_url_for(config)`` turns "no URL configured" into the URL of a private
embedded server started once per process (the driver). Executors must not
start their own: the driver resolves the URL first and ships a config that
names it. ``client_for(url)`` returns a cached client per URL and process
(redis-py pools reset themselves after fork). Every connection failure is
raised as one :class:`~ftlayer.errors.RedisUnavailableError` naming the URL
with its password masked.
"""

from __future__ import annotations

import os
import threading
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ftlayer.config import FTConfig
from ftlayer.errors import RedisUnavailableError
from ftlayer.outage import OutageRetry
from ftlayer.server import EmbeddedServer

_lock = threading.Lock()
_embedded: EmbeddedServer | None = None
_clients: dict[tuple[int, str, float, float], redis.Redis] = {}


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable redis url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{user}:***@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def embedded_server(config: FTConfig) -> EmbeddedServer:
    """The process's embedded server, started on first use with the config's data dir."""
    global _embedded
    with _lock:
        if _embedded is None or _embedded.pid is None:
            fsync = "always" if config.durability == "waitaof" else "everysec"
            _embedded = EmbeddedServer(
                data_dir=config.embedded_data_dir or None, appendfsync=fsync
            ).start()
        return _embedded


def redis_url_for(config: FTConfig) -> str:
    """The configured URL, or the URL of the embedded server (started if needed)."""
    return config.redis_url or embedded_server(config).url


def resolved(config: FTConfig) -> FTConfig:
    """A copy of ``config`` whose redis_url is set, safe to ship to executors."""
    return config if config.redis_url else config.replace(redis_url=redis_url_for(config))


def client_for(
    url: str, connect_timeout_s: float = 5.0, *, check: bool = True, outage_budget_s: float = 0.0
) -> redis.Redis:
    """A cached redis-py client for ``url`` in this process; PINGs it once when created.

    Connection errors and timeouts are retried three times with backoff by
    redis-py, or, with ``outage_budget_s`` > 0, for up to that many seconds
    (:class:`~ftlayer.outage.OutageRetry`). That is safe because every ftlayer
    script is idempotent (persist skips known ids, flushes carry tokens, fails
    and replays check state).
    """
    key = (os.getpid(), url, connect_timeout_s, outage_budget_s)
    with _lock:
        client = _clients.get(key)
    if client is not None:
        return client
    try:
        client = redis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout_s,
            socket_keepalive=True,
            health_check_interval=30,
            retry=(OutageRetry(outage_budget_s) if outage_budget_s > 0
                   else Retry(ExponentialBackoff(cap=1.0, base=0.05), 3)),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        )
        if check:
            client.ping()
    except redis.AuthenticationError as exc:
        msg = f"Redis at {mask_url(url)} refused the credentials: {exc}"
        raise RedisUnavailableError(msg) from exc
    except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError) as exc:
        msg = f"cannot reach Redis at {mask_url(url)}: {exc}"
        raise RedisUnavailableError(msg) from exc
    with _lock:
        _clients[key] = client
    return client


def connect(config: FTConfig) -> redis.Redis:
    """A client for the configured server, starting the embedded one if no URL is set."""
    return client_for(redis_url_for(config), config.connect_timeout_s)

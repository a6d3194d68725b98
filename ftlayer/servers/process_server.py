"""The process's embedded server: what a config that names no ``redis_url`` connects to.

``redis_url_for(config)`` turns "no URL configured" into the URL of a private embedded server
(:class:`~ftlayer.servers.embedded.EmbeddedServer`) started once per process (the driver).
Executors must not start their own: the driver resolves the URL first (:func:`resolved`) and
ships a config that names it. ``ftlayer.store`` never starts a server: the
:class:`~ftlayer.facade.ft_layer.FTLayer` facade resolves its config here before it builds a
shard's store, and the runtime resolves its own.
"""

from __future__ import annotations

import threading

import redis

from ftlayer.config import FTConfig
from ftlayer.servers.embedded import EmbeddedServer
from ftlayer.store.connection import client_for

_lock = threading.Lock()
_embedded: EmbeddedServer | None = None


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


def connect(config: FTConfig) -> redis.Redis:
    """A client for the configured server, starting the embedded one if no URL is set."""
    return client_for(redis_url_for(config), config.connect_timeout_s)

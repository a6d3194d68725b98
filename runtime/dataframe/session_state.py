"""Which config and session an acking point, a row function or a writer uses when given none.

:func:`config_or_last` is what every acking point and row function goes through: a config without
a Redis URL must never reach an executor or a settle call. The state behind it (the config of the
most recently opened source handle, and the embedded server each namespace's sources were opened
on) is written by :mod:`runtime.dataframe.sources` when it opens a handle (:func:`remember_last`,
:func:`remember_embedded`), and read here. Thread-safe for its use: a list and a dict assigned
whole under the GIL.
"""

from __future__ import annotations

from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from ftlayer.servers.process_server import resolved
from runtime.spark.conf import effective_config
from runtime.spark.connect import active_connect_session

__all__ = ["active_session", "config_or_last", "last_config", "remember_embedded", "remember_last", "session_config"]

_last: list[FTConfig] = []
_embedded: dict[str, str] = {}  # namespace -> URL of the embedded server its sources were opened on


def remember_last(config: FTConfig) -> None:
    """``config`` is that of the source handle opened last (:func:`last_config`)."""
    _last[:] = [config]


def remember_embedded(namespace: str, url: str) -> None:
    """The sources of ``namespace`` were opened on the embedded server at ``url``."""
    _embedded[namespace] = url


def active_session() -> Any:
    """The active SparkSession of this thread, else the process's default one (the one
    ``SparkSession.builder.getOrCreate()`` returns; Spark keeps "active" per thread), classic or
    Spark Connect; None if there is none, or no pyspark."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    found = SparkSession.getActiveSession() or getattr(SparkSession, "_instantiatedSession", None)
    return found if found is not None else active_connect_session()


def session_config(config: FTConfig | None, spark: Any = None) -> FTConfig:
    """``config`` (default ``FTConfig.load()``) with the ``spark.ftlayer.*`` keys of ``spark`` (default:
    the active session) applied to every option not set in code."""
    base = config if config is not None else FTConfig.load()
    session = spark if spark is not None else active_session()
    return effective_config(base, session) if session is not None else base


def config_or_last(config: FTConfig | None) -> FTConfig:
    """``config`` with its Redis URL resolved, or :func:`last_config` when None. Every acking point
    and row function goes through it: a config without a URL must never reach an executor or a
    settle call. Without a URL it takes the embedded server its namespace's sources were opened
    on in this process (else the process's own embedded server), with the session's Spark conf."""
    if config is None:
        return last_config()
    if config.redis_url:
        return config
    cfg = session_config(config)
    url = _embedded.get(cfg.namespace)
    return cfg.replace(redis_url=url) if url else resolved(cfg)


def last_config() -> FTConfig:
    """The config of the most recently opened source handle; ConfigError if none was opened."""
    if not _last:
        msg = "no ftlayer source was opened in this process: pass config= (or call ftlayer.read_stream first)"
        raise ConfigError(msg)
    return _last[0]

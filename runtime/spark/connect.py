"""Spark Connect sessions: telling them from classic ones, and the few things ftlayer does differently.

A Spark Connect session (``SparkSession.builder.remote("sc://host:15002")``) has no JVM in the
user's process: no ``sparkContext``, no ``_jvm``, no ``getLocalProperty``. The DataFrame path runs
on it (docs/operations.md, "Spark Connect"); the Topology API does not (:func:`refuse_connect`).
What this module gives the rest of the runtime:

- :func:`is_connect`: whether a session, DataFrame or query belongs to Spark Connect, told by its
  class's module, so answering imports nothing of ``pyspark.sql.connect`` (which needs grpc);
- :func:`refuse_connect`: :class:`~ftlayer.errors.SparkConnectUnsupportedError` naming an API that
  needs the JVM, and what runs on Connect instead;
- :func:`check_server_reaches`: no ``redis_url`` means an embedded server on 127.0.0.1 of the
  user's machine, which a Connect server on another host (its Python workers run the FT source,
  the row functions and the ``foreachBatch`` function) cannot reach: ConfigError;
- **batch tokens**: on Connect a ``foreachBatch`` function runs in a Python process of the
  Connect server, and its actions run as Connect operations, outside the query's thread, so
  their read tasks get no query or batch id from Spark. The acking point tags the calling
  thread's operations with the job tag :func:`batch_job_tag` (``SparkSession.addTag``); Spark
  Connect gives it to every job of those operations (task local property ``spark.job.tags``),
  and the FT source's read tasks file the batch under the token (:func:`token_from_job_tags`,
  ``ftlayer.acker.batch_acks``).
"""

from __future__ import annotations

import re
import sys
import uuid
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, SparkConnectUnsupportedError

__all__ = [
    "JOB_TAGS_PROPERTY", "active_connect_session", "batch_job_tag", "check_server_reaches", "is_connect",
    "new_batch_token", "refuse_connect", "session_id", "token_from_job_tags",
]

JOB_TAGS_PROPERTY = "spark.job.tags"  # a task's local property: its job's tags, comma-separated
_TAG_PREFIX = "ftlayer-batch-"
# Spark Connect turns a session tag T into the job tag "SparkConnect_SessionTag_User_<user>_Session_<id>_Tag_T"
_TOKEN_RE = re.compile(r"(?:^|_Tag_)" + re.escape(_TAG_PREFIX) + r"([0-9a-f]{32})$")
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


def is_connect(obj: Any) -> bool:
    """True if ``obj`` (a SparkSession, DataFrame, StreamingQuery...) is Spark Connect's."""
    return type(obj).__module__.startswith("pyspark.sql.connect.")


def session_id(spark: Any) -> str | None:
    """The server-side session id of a Spark Connect session; None for a classic one (or None)."""
    if spark is None or not is_connect(spark):
        return None
    return str(spark.session_id)


def active_connect_session() -> Any:
    """This thread's active Spark Connect session, else the process's default one; None if there
    is none (or pyspark.sql.connect was never imported: then no Connect session exists)."""
    module = sys.modules.get("pyspark.sql.connect.session")
    if module is None:
        return None
    cls = module.SparkSession
    return cls.getActiveSession() or getattr(cls, "_default_session", None)


def refuse_connect(spark: Any, api: str, needs: str) -> None:
    """Raise :class:`SparkConnectUnsupportedError` if ``spark`` is a Spark Connect session.

    ``api`` names the refused call, ``needs`` what it uses the JVM for.
    """
    if not is_connect(spark):
        return
    msg = (f"{api} needs a classic SparkSession ({needs}), and was given a Spark Connect session, which has "
           "no JVM in this process. On Spark Connect use the DataFrame path (ftlayer.read_stream, ftlayer.udf, "
           "ftlayer.map_in_pandas, ftlayer.acking, ftlayer.acking_sink), or run this on a classic session "
           "(ftlayer.local_session, SparkSession.builder.master(...)); see docs/operations.md, 'Spark Connect'")
    raise SparkConnectUnsupportedError(msg)


def check_server_reaches(spark: Any, config: FTConfig) -> None:
    """Refuse an embedded server (no ``redis_url``) for a Connect server on another host (ConfigError).

    The embedded server listens on 127.0.0.1 of this machine; the Connect server's Python
    workers (the FT source, row functions, the ``foreachBatch`` function) must reach it.
    """
    if config.redis_url or not is_connect(spark):
        return
    host = str(spark.client.host)
    if host in _LOCAL_HOSTS:
        return
    msg = (f"redis_url is empty but the Spark Connect server is {host!r}: the embedded server listens on "
           "127.0.0.1 of this machine, which the Connect server's Python workers cannot reach. Set redis_url "
           "(FTLAYER_REDIS_URL or spark.conf.set('spark.ftlayer.redis_url', 'redis://HOST:PORT/0')) to a "
           "Redis that this process, the Connect server and its executors can reach (docs/operations.md, "
           "'Spark Connect')")
    raise ConfigError(msg)


def new_batch_token() -> str:
    """A fresh batch token (32 hex digits)."""
    return uuid.uuid4().hex


def batch_job_tag(token: str) -> str:
    """The session tag (``SparkSession.addTag``) that carries batch token ``token`` to the read tasks."""
    return _TAG_PREFIX + token


def token_from_job_tags(job_tags: str | None) -> str | None:
    """The batch token among a task's job tags (``spark.job.tags``, comma-separated), or None."""
    for tag in (job_tags or "").split(","):
        found = _TOKEN_RE.search(tag.strip())
        if found is not None:
            return found.group(1)
    return None

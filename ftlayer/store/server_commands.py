"""The Redis commands ftlayer sends, and a probe of whether a user may run them (``ftlayer doctor``).

:data:`COMMANDS` lists every command ftlayer's scripts call (``redis.call`` in ``ftlayer/lua``;
a test checks the list against the sources) and every command its Python side sends, each
with arguments of the right arity around a key (``K``). Each row says what needs it:
``required`` (ftlayer fails without it), ``optional`` (ftlayer copes: it only checks or shows
less, e.g. ``INFO`` for the server settings checked at open), or a durability mode.

Contract of :func:`probe_permissions`: it runs ``MULTI``, sends each command (its key in the
namespace, ``<namespace>:{ftlayer-doctor}:probe``), and ends with ``DISCARD``, so nothing is
executed and no key is written. A server checks a user's ACL rights (commands and key
patterns) when it queues a command, before it would run it, so each reply tells: ``QUEUED``
(or a cluster redirection, ``MOVED``/``ASK``, which comes after the ACL check) means allowed,
``NOPERM`` denied. Each denial is one entry of the server's ``ACL LOG``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

__all__ = ["COMMANDS", "PROBE_KEY", "CommandUse", "probe_permissions"]

PROBE_KEY = "{namespace}:{{ftlayer-doctor}}:probe"


@dataclass(frozen=True)
class CommandUse:
    """One command ftlayer sends: its probe arguments (``K`` = the probe key) and what needs it."""

    argv: tuple[str, ...]
    need: str = "required"  # "required", "optional", or the durability modes that need it ("waitaof ...")
    why: str = ""

    @property
    def name(self) -> str:
        """``HGET``, or ``CONFIG GET`` for a command with a subcommand."""
        return " ".join(self.argv[:2]) if self.argv[0] in ("CONFIG", "SCRIPT", "MEMORY", "XINFO", "CLUSTER") \
            else self.argv[0]


def _k(*argv: str) -> CommandUse:
    return CommandUse(argv)


COMMANDS: tuple[CommandUse, ...] = (
    # called by the scripts in ftlayer/lua (tests/ftlayer/store/test_server_commands.py keeps this in step)
    _k("HINCRBY", "K", "f", "1"), _k("HGET", "K", "f"), _k("HDEL", "K", "f"), _k("HSET", "K", "f", "v"),
    _k("HEXISTS", "K", "f"), _k("HSETNX", "K", "f", "v"), _k("HSCAN", "K", "0"), _k("HMGET", "K", "f"),
    _k("HGETALL", "K"), _k("HLEN", "K"), _k("GET", "K"), _k("SET", "K", "v"), _k("INCRBY", "K", "1"),
    _k("EXISTS", "K"), _k("DEL", "K"), _k("PEXPIRE", "K", "1000"), _k("LPOP", "K"), _k("LPUSH", "K", "v"),
    _k("RPUSH", "K", "v"), _k("LINDEX", "K", "0"), _k("LLEN", "K"), _k("ZADD", "K", "1", "m"),
    _k("ZREM", "K", "m"), _k("SADD", "K", "m"), _k("SISMEMBER", "K", "m"), _k("XADD", "K", "*", "f", "v"),
    _k("XRANGE", "K", "-", "+"), _k("XTRIM", "K", "MAXLEN", "0"), _k("XDEL", "K", "0-1"),
    # sent by the Python side
    CommandUse(("EVALSHA", "0" * 40, "1", "K"), why="every state change runs a script"),
    CommandUse(("SCRIPT", "LOAD", "return 1"), why="scripts are loaded when the server lacks them"),
    _k("PING"), _k("HKEYS", "K"), _k("SMEMBERS", "K"), _k("SREM", "K", "m"), _k("SETNX", "K", "v"),
    _k("EXPIRE", "K", "1"), _k("PTTL", "K"), _k("TYPE", "K"), _k("LRANGE", "K", "0", "-1"),
    _k("ZRANGEBYSCORE", "K", "0", "1"), _k("XLEN", "K"), _k("XINFO", "STREAM", "K"),
    _k("SCAN", "0", "MATCH", "K", "COUNT", "1"),
    CommandUse(("WAIT", "0", "0"), "replicated replicated-aof", "durability waits for a replica"),
    CommandUse(("WAITAOF", "0", "0", "0"), "waitaof replicated-aof", "durability waits for an AOF fsync"),
    CommandUse(("INFO", "memory"), "optional",
               "the eviction, AOF and replication checks at open; without it they are skipped with a warning"),
    CommandUse(("CONFIG", "GET", "appendfsync"), "optional", "the appendfsync check of durability = 'waitaof'"),
    CommandUse(("MEMORY", "USAGE", "K"), "optional", "the bytes column of 'ftlayer sources describe'"),
    CommandUse(("CLUSTER", "SLOTS"), "optional", "a cluster's slot map (needed on a cluster only)"),
)


def needed(use: CommandUse, durability: str) -> bool:
    """Whether ftlayer with this durability mode fails when ``use`` is denied."""
    return use.need == "required" or durability in use.need.split()


def probe_permissions(client: redis.Redis, namespace: str) -> dict[str, str | None]:
    """Per command name: None if the connection's user may run it on the namespace's keys, else
    the server's NOPERM message (see the module contract: nothing runs)."""
    key = PROBE_KEY.format(namespace=namespace)
    conn: Any = client.connection_pool.get_connection()  # redis-py types send_command loosely
    out: dict[str, str | None] = {}
    try:
        conn.send_command("MULTI")
        conn.read_response()
        for use in COMMANDS:
            conn.send_command(*(key if a == "K" else a for a in use.argv))
            try:
                conn.read_response()
                out[use.name] = None
            except redis.exceptions.NoPermissionError as exc:
                out[use.name] = str(exc)
            except redis.ResponseError as exc:  # MOVED / ASK (cluster): past the ACL check
                text = str(exc)
                out[use.name] = text if text.startswith("NOPERM") else None
        conn.send_command("DISCARD")
        conn.read_response()
    except BaseException:
        conn.disconnect()  # a connection left inside MULTI must not go back to the pool
        raise
    finally:
        client.connection_pool.release(conn)
    return out

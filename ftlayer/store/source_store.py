"""SourceStore: one source's Redis state handle (client, key names, config, scripts).

Every ftlayer component of a source (AckerTable, PersistenceLayer,
RotatingBucketMap, Replayer, DeadLetters) is built on one SourceStore. It is
cheap and picklable: only the URL, namespace and names travel to executors; the
client is looked up per process (see ``ftlayer.store.connection``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, cast

import redis
from redis.commands.core import Script
from redis.exceptions import ClusterDownError, NoScriptError, TryAgainError

from ftlayer.config import FTConfig
from ftlayer.config.redis_url import mask_url
from ftlayer.errors import AckerError, ChunkIdInUseError, ConfigError, DurabilityError, RedisUnavailableError
from ftlayer.keyspace.keys import FORMAT_VERSION, SourceKeys, owner_key, sources_key
from ftlayer.scripting.lua_script import LuaScript
from ftlayer.store.connection import client_for, is_cluster, refresh_slots, ride_out
from ftlayer.store.owner_record import new_owner_record
from ftlayer.store.resp import carries_big_arg, pack_command

Clock = Callable[[], float]
T = TypeVar("T")

COUNTERS = (
    "persisted", "acked", "failed_explicit", "failed_timeout", "replayed",
    "dead_lettered", "requeued", "late_deltas", "duplicate_flushes", "refiled_unread", "refiled_held",
    "late_completions",
)
log = logging.getLogger(__name__)
_PLAIN_EXECUTE = redis.Redis.execute_command  # see SourceStore._evalsha

# durability mode -> (wait command without its timeout: its counts are the minimums the
# reply must reach, what it confirms)
_WAITS: dict[str, tuple[tuple[Any, ...], str]] = {
    "waitaof": (("WAITAOF", 1, 0), "the local AOF fsync (needs appendonly yes)"),
    "replicated": (("WAIT", 1), "a replica's receipt of the writes (needs a connected replica)"),
    "replicated-aof": (("WAITAOF", 1, 1), "the local and one replica's AOF fsync"),
}


class SourceStore:
    """Redis handle for one shard of one source of one topology (``shard`` of ``config.num_shards``;
    shard 0 of 1 is the whole source). Picklable (the client is not pickled).

    ``outage_budget_s`` > 0 makes this handle's commands wait out a Redis outage for up to
    that long (:mod:`ftlayer.store.outage`); 0 keeps redis-py's three quick retries.
    """

    def __init__(
        self,
        config: FTConfig,
        topology: str,
        source: str,
        *,
        client: redis.Redis | None = None,
        clock: Clock = time.time,
        outage_budget_s: float = 0.0,
        shard: int = 0,
    ) -> None:
        self.config = config
        self.outage_budget_s = outage_budget_s  # > 0: commands wait out an outage (ftlayer.store.outage)
        self.keys = SourceKeys(config.namespace, topology, source, shard, config.num_shards)
        self.clock = clock
        if not config.redis_url and client is None:
            msg = ("a SourceStore needs a redis_url or a client: resolve the config first "
                   "(ftlayer.servers.process_server.resolved)")
            raise ConfigError(msg)
        self._url = config.redis_url or None
        self._client = client
        self._scripts: dict[str, Script] = {}

    def __getstate__(self) -> dict[str, Any]:
        if self._url is None:
            msg = "a SourceStore built on an explicit client cannot be pickled; configure redis_url"
            raise AckerError(msg)
        state = self.__dict__.copy()
        state["_client"] = None
        state["_scripts"] = {}
        return state

    @property
    def client(self) -> redis.Redis:
        """This process's client for the source's server."""
        if self._client is None:
            assert self._url is not None
            self._client = client_for(self._url, self.config.connect_timeout_s,
                                      outage_budget_s=self.outage_budget_s)
        return self._client

    def script(self, script: LuaScript) -> Script:
        """``script`` registered on this process's client (EVALSHA, reloaded after NOSCRIPT)."""
        found = self._scripts.get(script.name)
        if found is None:
            found = self.client.register_script(script.source.text)
            self._scripts[script.name] = found
        return found

    @property
    def state_keys(self) -> list[str]:
        """KEYS[1..11] of the scripts that change record state, in the order of
        ``ftlayer.scripting.lua_script.STATE_KEYS``."""
        k = self.keys
        return [k.chunks, k.chunk_acks, k.chunk_frames, k.partials, k.live,
                k.gen, k.bcnt, k.failed, k.due, k.stats, k.buckets]

    def channel_keys(self, num_channels: int) -> list[str]:
        """The channel streams ``ch:0 .. ch:<num_channels - 1>``, declared by scripts that persist."""
        return [self.keys.channel(c) for c in range(num_channels)]

    def token_ttl_ms(self) -> int:
        """How long a flush token or dead-letter guard is kept.

        It must outlive every retry of its call while the record can still be
        pending (at most timeout * n/(n-1), plus replay time), so keep a wide margin.
        """
        cfg = self.config
        return int(max(3600.0, 4 * cfg.timeout_s * cfg.num_buckets) * 1000)

    def now_ms(self) -> int:
        """The injected clock in whole milliseconds."""
        return int(self.clock() * 1000)

    def backoff_args(self) -> list[float]:
        """ARGV of the replay backoff: initial ms, multiplier, max ms."""
        c = self.config
        return [
            c.replay_backoff_initial_s * 1000,
            c.replay_backoff_multiplier,
            c.replay_backoff_max_s * 1000,
        ]

    def run(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        """Run one script; Redis errors become AckerError / RedisUnavailableError naming the source (and
        for an error inside the script, the ``.lua`` file and line: ``ftlayer.scripting.lua_source``). KEYS and ARGV
        that do not fit the script's declaration raise ScriptCallError before anything is sent."""
        script.check(keys, args)
        try:
            return self.ride_out(lambda: self._evalsha(script, keys, args))
        except (redis.ConnectionError, redis.TimeoutError, ClusterDownError, TryAgainError) as exc:
            where = mask_url(self._url or "<explicit client>")
            msg = f"Redis at {where} unreachable during {script.name} for source {self.keys.prefix!r}: {exc}"
            raise RedisUnavailableError(msg) from exc
        except redis.ResponseError as exc:
            msg = f"{script.name} failed for source {self.keys.prefix!r}: {script.source.explain(str(exc))}"
            raise AckerError(msg) from exc

    def _evalsha(self, script: LuaScript, keys: list[str], args: list[Any]) -> Any:
        registered = self.script(script)
        client = self.client
        # redis-py's cluster client routes the call by its keys; a client class that wraps
        # execute_command (tracing, the tests' injected faults) gets its calls through it
        if is_cluster(client) or type(client).execute_command is not _PLAIN_EXECUTE:
            return registered(keys=keys, args=args)
        return evalsha(client, registered, keys, args)

    def ride_out(self, call: Callable[[], T]) -> T:
        """``call()``; on a cluster, retried through a failover or a slot migration for
        ``outage_budget_s`` or at least ``CLUSTER_RIDE_OUT_S`` (``ftlayer.store.connection.ride_out``).
        Only for idempotent calls (every ftlayer script, reads, trims)."""
        return ride_out(self.client, call, self.outage_budget_s)

    def node_client(self) -> redis.Redis:
        """A client of the one server that owns this source's keys (the client itself if not a cluster)."""
        client = self.client
        if not is_cluster(client):
            return client
        cluster = cast(redis.RedisCluster, client)
        node = cluster.get_node_from_key(self.keys.chunks)  # type: ignore[no-untyped-call]
        return cluster.get_redis_connection(node)

    def run_durable(self, calls: Sequence[tuple[LuaScript, list[str], list[Any]]]) -> list[Any]:
        """Run scripts that persist records, then wait until the durability mode's promise holds.

        In 'none' and 'everysec' this is :meth:`run` per call. In 'waitaof',
        'replicated' and 'replicated-aof' the calls and one WAITAOF or WAIT go
        in one pipeline on one connection to the node that owns the source:
        those commands confirm the writes of *their own connection*, so a wait
        sent on another pooled connection, or to another cluster node, would
        confirm nothing. Raises :class:`DurabilityError` (never retried here)
        if the wait is refused or not confirmed within ``waitaof_timeout_ms``:
        the writes reached the primary, only their fsync or replication is
        unconfirmed. Every script here is idempotent, so a caller may retry.
        """
        wait = _WAITS.get(self.config.durability)
        if wait is None or not calls:
            return [self.run(script, keys, args) for script, keys, args in calls]
        for script, keys, args in calls:
            script.check(keys, args)
        command, what = wait
        timeout_ms = self.config.waitaof_timeout_ms
        try:
            pipe = self.node_client().pipeline(transaction=False)
            for script, keys, args in calls:
                self.script(script)(keys=keys, args=args, client=pipe)
            pipe.execute_command(*command, timeout_ms)  # type: ignore[no-untyped-call]
            replies = pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._refresh_slots()
            where = mask_url(self._url or "<explicit client>")
            msg = f"Redis at {where} unreachable during {calls[0][0].name} for source {self.keys.prefix!r}: {exc}"
            raise RedisUnavailableError(msg) from exc
        for (script, _, _), reply in zip(calls, replies, strict=False):
            if isinstance(reply, redis.ResponseError):
                msg = f"{script.name} failed for source {self.keys.prefix!r}: {script.source.explain(str(reply))}"
                raise AckerError(msg) from reply
        mode = self.config.durability
        confirm = replies[-1]
        if isinstance(confirm, redis.ResponseError):
            msg = f'durability = "{mode}": the server refused {command[0]} for {self.keys.prefix!r} ({what}): {confirm}'
            raise DurabilityError(msg) from confirm
        counts = [int(c) for c in confirm] if isinstance(confirm, list) else [int(confirm)]
        if any(got < need for got, need in zip(counts, command[1:], strict=False)):
            msg = (
                f'durability = "{mode}": {what} was not confirmed for a write to {self.keys.prefix!r} '
                f"within waitaof_timeout_ms={timeout_ms}; the write reached the primary but may be "
                f"lost if it fails now"
            )
            raise DurabilityError(msg)
        return list(replies[:-1])

    def _refresh_slots(self) -> None:
        """After a node did not answer: let a cluster client re-read the slot map (a failover)."""
        refresh_slots(self.client)

    def register(self, num_channels: int) -> None:
        """Record the source in the namespace and its channel count in ``meta`` (first writer wins).

        Also, each only if missing: the shard count, the start time of bucket generation 0 of this
        shard in ``gtime`` (for the age of the oldest pending record) and the namespace's
        owner record ``<namespace>:owner`` = ``{"created_ms": ..., "by": "ftlayer"}``,
        which the CLI's destructive commands require (see :func:`owner_record`).
        """
        k = self.keys
        now = self.now_ms()
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(sources_key(k.namespace), f"{k.topology}/{k.source}")
        pipe.hsetnx(k.meta, "num_channels", num_channels)
        pipe.hsetnx(k.meta, "num_shards", k.num_shards)
        pipe.hsetnx(k.meta, "format", FORMAT_VERSION)
        pipe.hsetnx(k.meta, "created_ms", now)
        pipe.setnx(owner_key(k.namespace), new_owner_record(now))
        pipe.execute()
        self.register_shard()

    def register_shard(self) -> None:
        """The start time of this shard's bucket generation 0 (``gtime``), if missing."""
        self.client.hsetnx(self.keys.key("gtime"), 0, self.now_ms())

    def recorded_shards(self) -> int | None:
        """The shard count the source registered with (1 for a source older than shards), or None."""
        raw = self.client.hmget(self.keys.meta, ["num_channels", "num_shards"])
        if raw[0] is None:
            return None
        return int(raw[1]) if raw[1] is not None else 1

    def recorded_channels(self) -> int | None:
        """The channel count the source's data was written with, or None if unregistered."""
        raw = self.client.hget(self.keys.meta, "num_channels")
        return int(raw) if raw is not None else None

    def stats(self) -> dict[str, int]:
        """Counters plus live sizes: pending, failed_waiting, dead_letters, bucket gen."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(k.stats)
        pipe.get(k.live)
        pipe.hlen(k.failed)
        pipe.xlen(k.dlq)
        pipe.get(k.gen)
        counters, pending, failed, dead, gen = pipe.execute()
        out = dict.fromkeys(COUNTERS, 0)
        out.update({key.decode(): int(v) for key, v in counters.items()})
        out.update(pending=int(pending or 0), failed_waiting=failed, dead_letters=dead, gen=int(gen or 0))
        return out

    def leftover_keys(
        self, allowed: Iterable[str] = ("gen", "stats", "meta", "lease", "gtime", "rd", "live"),
    ) -> list[str]:
        """Keys of the source that hold state after a drain, minus documented bookkeeping.

        Empty channel streams, unexpired flush tokens and the replaced links (``rpl``: swept
        and expiring a day after the last timeout replay) are bookkeeping too.
        Returns the suffixes of everything else (a leak if non-empty after a drain).
        """
        k = self.keys
        allowed_set = set(allowed)
        out: list[str] = []
        for raw in self.client.scan_iter(match=k.prefix + "*"):
            name = raw.decode()
            suffix = name[len(k.prefix):]
            if suffix == "live" and int(self.client.get(name) or 0) != 0:
                out.append(suffix)  # records still counted as pending after a drain
                continue
            if suffix in allowed_set or suffix.startswith("tok:") or suffix == "rpl":
                continue
            if suffix.startswith("ch:") and self.client.xlen(name) == 0:
                continue
            if suffix == "dlq":  # dead letters are kept on purpose until requeued or purged
                continue
            out.append(suffix)
        return sorted(out)


class _Pin:
    """A pooled connection one thread keeps for its EVALSHA calls (:func:`evalsha`); handed back to
    the pool when the thread ends (its thread-local is collected) or the pin is replaced."""

    def __init__(self, pool: redis.ConnectionPool) -> None:
        self.pool = pool
        self.pid = os.getpid()
        self.conn = pool.get_connection()

    def __del__(self) -> None:
        if self.pid == os.getpid():  # a forked child's pool is not the parent's
            with contextlib.suppress(Exception):
                self.pool.release(self.conn)


_pins = threading.local()
_KEEP_MIN_CONNECTIONS = 1 << 16  # redis-py 7 pools had 2**31 by default; redis-py 8 pools have 100 and lend per call


def _pinned(pool: redis.ConnectionPool) -> Any:
    """This thread's connection of ``pool`` (see :class:`_Pin`)."""
    pins: dict[int, _Pin] = _pins.__dict__.setdefault("by_pool", {})
    pin = pins.get(id(pool))
    if pin is None or pin.pool is not pool or pin.pid != os.getpid():
        pin = pins[id(pool)] = _Pin(pool)
    return pin.conn


def evalsha(client: redis.Redis, script: Script, keys: list[str], args: list[Any]) -> Any:
    """``script(keys=keys, args=args)`` on a plain (not cluster) client, sent directly on a pooled
    connection this thread keeps: what redis-py's Script call does (EVALSHA; on NOSCRIPT, SCRIPT
    LOAD and EVALSHA once more) and what its ``execute_command`` does around it (the connection's
    retry, which disconnects after a connection error and sends again on a fresh connection,
    within the client's outage budget), without its per-command metrics, event dispatch and
    response callbacks (EVALSHA has none), and without taking the connection from the pool and
    giving it back per call (redis-py 8 records metrics and dispatches an event at each). Ingest
    pays these per persist, and a webhook's persist carries only a few requests. A large argument
    (PERSIST's chunks) is sent as it is, not copied into the packed command (:mod:`ftlayer.store.resp`)."""
    pool = client.connection_pool
    # a pool that limits its connections (a blocking pool, a max_connections a user set) could run
    # out with one kept per thread: such a pool lends one per call, as redis-py does
    keep = type(pool) is redis.ConnectionPool and pool.max_connections >= _KEEP_MIN_CONNECTIONS
    conn = _pinned(pool) if keep else pool.get_connection()

    command = ("EVALSHA", script.sha, len(keys), *keys, *args)
    big = carries_big_arg(args)

    def once() -> Any:
        if big:  # packed here: hiredis's packer copies PERSIST's megabytes of chunks (ftlayer.store.resp)
            conn.send_packed_command(pack_command(command, conn.encoder.encode))
        else:
            conn.send_command(*command)
        return conn.read_response()

    try:
        try:
            return conn.retry.call_with_retry(once, lambda _exc: conn.disconnect())
        except NoScriptError:  # a server restarted without its script cache, or another server
            script.sha = client.script_load(script.script)
            return conn.retry.call_with_retry(once, lambda _exc: conn.disconnect())
    finally:
        if not keep:
            pool.release(conn)


def in_use_error(keys: SourceKeys, chunk: bytes, what: str) -> ChunkIdInUseError:
    """The error for a chunk id that a pending chunk of the source already uses (nothing was written)."""
    msg = (
        f"{what} on source {keys.prefix!r}: chunk id {chunk.hex()} is in use by pending records "
        f"(ids are drawn at random: draw new ones); nothing was written"
    )
    return ChunkIdInUseError(msg, chunk)


def persist_refused_error(
    keys: SourceKeys, chunk: bytes, filed: Sequence[int], refused: Sequence[int], new: int,
) -> ChunkIdInUseError:
    """The error for a persist some of whose calls were refused: it says exactly what was filed."""
    msg = (
        f"persist on source {keys.prefix!r}: chunk id {chunk.hex()} is in use by pending records "
        f"(ids are drawn at random: draw new ones); {len(refused)} record(s) were refused and nothing "
        f"of them was written; the other {len(filed)} were filed ({new} new, the rest already "
        "pending): retry only the refused ones (ChunkIdInUseError.refused) under new ids"
    )
    return ChunkIdInUseError(msg, chunk, filed=tuple(filed), refused=tuple(refused), new=new)

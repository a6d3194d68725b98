"""FTConfig: the one frozen, validated configuration object.

Precedence, lowest to highest: defaults, a TOML file, ``FTLAYER_*`` environment
variables, ``spark.ftlayer.*`` Spark conf. Every option is a field below; its
env var is ``FTLAYER_`` + the upper-cased name and its Spark conf key is
``spark.ftlayer.`` + the name. A bad value is refused when the object is built,
with a :class:`~ftlayer.errors.ConfigError` naming the option, the value and
what is allowed. Instances are immutable and picklable, so they ship to Spark
executors as they are.

Options set in code win over every other source: keyword arguments of
``FTConfig(...)``, keyword ``overrides`` of :meth:`FTConfig.load` and the
changes of :meth:`FTConfig.replace` are remembered as *explicit*
(:attr:`FTConfig.explicit_options`). When a topology starts on a SparkSession,
:meth:`FTConfig.with_spark_conf` applies the session's ``spark.ftlayer.*`` keys
to every other option, so ``spark-submit --conf spark.ftlayer.timeout_s=60``
beats the file and the environment but never a value written in the program.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ftlayer.config.checks import at_least, bad, between, expected_type, one_of, positive
from ftlayer.config.redis_url import mask_url, masked
from ftlayer.config.sources import (
    ENV_PREFIX,
    SPARK_PREFIX,
    config_path,
    env_values,
    naming_origin,
    read_toml,
    spark_values,
)

__all__ = ["DURABILITY_MODES", "SINGLE_SERVER_DURABILITY", "STATUSES", "TEMP_STATE_DIR", "FTConfig"]

DURABILITY_MODES = ("none", "everysec", "waitaof", "replicated", "replicated-aof")
#: the modes a single server (no replica) can serve
SINGLE_SERVER_DURABILITY = ("none", "everysec", "waitaof")
STATUSES = ("on", "off")
TEMP_STATE_DIR = ":temp:"  # state_dir value: a fresh temporary directory, removed at exit
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class FTConfig:
    """Settings of the FT layer. See docs/configuration.md for the same table with examples."""

    status: str = field(default="on", metadata=_doc(
        "FT status: 'on' persists, XORs and replays; 'off' runs the same topology with no "
        "persistence and no Redis traffic (the original design's FTStatus)."))
    redis_url: str = field(default="", metadata=_doc(
        "redis:// or rediss:// URL (user and password allowed). Empty starts a private "
        "embedded valkey-server on a free port."))
    namespace: str = field(default="ftlayer", metadata=_doc(
        "Prefix of every Redis key; letters, digits, '_', '.', '-' (1-64 chars)."))
    timeout_s: float = field(default=30.0, metadata=_doc(
        "Seconds a source record may stay unacked before it fails and is replayed (> 0)."))
    num_buckets: int = field(default=3, metadata=_doc(
        "Buckets of the rotating timeout map (>= 2). A record fails between timeout_s and "
        "timeout_s * (1 + 1/(num_buckets - 1)) after it was persisted."))
    num_channels: int = field(default=2, metadata=_doc(
        "Channels (Spark partitions) per source, fixed per topology (1-4096)."))
    num_shards: int = field(default=1, metadata=_doc(
        "Virtual shards per source (1-64): each has its own hash tag, chosen so the shards of a source "
        "spread evenly over a Valkey/Redis Cluster's primaries (ftlayer.keyspace.shard_tags). 1 keeps a source on "
        "one slot; on a cluster, 16 lets one source use every primary. Fixed when a source registers."))
    max_replays: int = field(default=5, metadata=_doc(
        "Replays of one origin record before it is dead-lettered (>= 0)."))
    replay_backoff_initial_s: float = field(default=1.0, metadata=_doc(
        "Delay before the first replay of a failed record, seconds (>= 0; 0 replays at once). With "
        "the defaults a record is replayed after 1, 2, 4, 8 and 16 s, then dead-lettered."))
    replay_backoff_multiplier: float = field(default=2.0, metadata=_doc(
        "Factor applied to the delay for each further replay (>= 1)."))
    replay_backoff_max_s: float = field(default=30.0, metadata=_doc(
        "Upper bound of the replay delay, seconds (>= replay_backoff_initial_s)."))
    sink_retry_budget_s: float = field(default=120.0, metadata=_doc(
        "DataFrame path: how long an acking point (ftlayer.acking, ftlayer.acking_sink) retries a "
        "micro-batch whose write failed, with backoff (0.5 s doubling to 10 s), before it gives up, "
        "seconds (>= 0; 0: no retry). While it retries, the sources' sink breaker is open and their "
        "replays wait, so a sink outage spends no replay budget. Keep it below max_batch_s."))
    max_batch_s: float = field(default=600.0, metadata=_doc(
        "Timeouts follow progress: while a micro-batch runs, none of the records it read times out, "
        "for up to this many seconds after Spark planned it (> 0). A batch still running past it "
        "(hung) has its records time out and replay as usual. See docs/guarantees.md."))
    max_pending: int = field(default=100_000, metadata=_doc(
        "Backpressure: ingest waits while this many source records are pending (>= 1)."))
    durability: str = field(default="everysec", metadata=_doc(
        "'none': no AOF promise; 'everysec': AOF fsynced every second (up to ~1 s of "
        "acknowledged persists can be lost on a server crash); 'waitaof': persist returns "
        "only after WAITAOF confirms the local fsync (open() refuses a server with appendonly no "
        "or appendfsync no; a timeout raises DurabilityError); 'replicated': persist returns only "
        "after WAIT confirms that a replica received the writes (open() refuses a primary without "
        "a connected replica), so a failover keeps them; 'replicated-aof': WAITAOF 1 1, the "
        "primary's and one replica's AOF fsync. See docs/guarantees.md."))
    waitaof_timeout_ms: int = field(default=2000, metadata=_doc(
        "How long persist waits for WAITAOF or WAIT in the 'waitaof' and 'replicated*' modes, "
        "milliseconds (>= 1); past it, "
        "DurabilityError (never retried: ingest stops with it)."))
    flush_batch_size: int = field(default=20_000, metadata=_doc(
        "Most records or XOR deltas sent in one server-side call (1-1000000)."))
    ingest_batch_records: int = field(default=20_000, metadata=_doc(
        "Most source records ingest takes before it persists them, if below flush_batch_size "
        "(1-1000000); it bounds what a source without an ack hook can lose if the driver dies "
        "(1: persist each record alone)."))
    sink_ack_every_records: int = field(default=1_000, metadata=_doc(
        "A sink task acks the records it wrote once this many are unacked (checked after each "
        "Arrow batch it writes), not only when it ends, and a retried sink task skips the records an "
        "earlier attempt completed, so this bounds what a killed Python worker makes the sink write "
        "twice (0-1000000; 0: ack once per task and let a retry write everything again, as Spark does)."))
    fuse_source_stage: bool = field(default=True, metadata=_doc(
        "Run a source's first operator stage inside the task that reads the source, when it is the "
        "source's only reader (one Arrow round trip between the JVM and Python less per record); "
        "false keeps it a separate mapInArrow stage. Ids, acks and results are the same either way."))
    freeze_worker_heap: bool = field(default=True, metadata=_doc(
        "In each Python worker that runs ftlayer tasks, collect garbage once and then freeze the "
        "objects alive (gc.freeze: modules and libraries), so the full collection PySpark runs after "
        "every task skips them (20-60 ms of CPU per task otherwise); objects made later are collected "
        "as usual. False leaves the workers' garbage collection as PySpark has it."))
    outage_budget_s: float = field(default=300.0, metadata=_doc(
        "How long Spark tasks, the FT source and the FT service wait for an unreachable Redis, "
        "retrying with backoff, before they give up, seconds (> 0). Ingest never gives up: it pauses."))
    connect_timeout_s: float = field(default=5.0, metadata=_doc(
        "Seconds to wait for the Redis server to answer (> 0)."))
    state_dir: str = field(default=".ftlayer", metadata=_doc(
        "Where a topology keeps its state: `<state_dir>/<topology>/` holds the embedded server's AOF "
        "(`redis/`) and the Spark checkpoint (`checkpoint/`), so a re-run resumes where the last one "
        "stopped; one process at a time owns it (a lock file). Relative paths are taken from the "
        "working directory. ':temp:' uses a fresh temporary directory, removed at exit (tests, "
        "throw-away runs)."))
    embedded_data_dir: str = field(default="", metadata=_doc(
        "Data directory of the embedded server; empty uses `<state_dir>/<topology>/redis/`."))
    metrics_port: int = field(default=0, metadata=_doc(
        "Port of the Prometheus metrics endpoint (runtime.driver.metrics.MetricsExporter) on the driver; "
        "0 turns metrics off, 1-65535 serves http://metrics_host:metrics_port/metrics."))
    metrics_host: str = field(default="127.0.0.1", metadata=_doc(
        "Address the metrics endpoint binds to; '127.0.0.1' keeps it local, '0.0.0.0' exposes it "
        "on every interface (it has no authentication)."))

    def __new__(cls, *args: Any, **kwargs: Any) -> FTConfig:
        # Remember which options the caller named: they are "set in code" and win over Spark conf.
        # (Unpickling calls __new__ with no arguments and then restores the attribute.)
        self = super().__new__(cls)
        named = [f.name for f in fields(cls)[: len(args)]]
        object.__setattr__(self, "_explicit", frozenset(named) | frozenset(kwargs))
        return self

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, expected_type(f.type)) or isinstance(value, bool) != (
                f.type == "bool"
            ):
                bad(f.name, value, f"a value of type {f.type}")
        one_of("status", self.status, STATUSES)
        one_of("durability", self.durability, DURABILITY_MODES)
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            bad("redis_url", masked(self.redis_url), "a URL starting with redis://, rediss:// or unix://")
        if not _NAMESPACE_RE.match(self.namespace):
            bad("namespace", self.namespace, "1-64 letters, digits, '_', '.' or '-'")
        positive("timeout_s", self.timeout_s)
        positive("connect_timeout_s", self.connect_timeout_s)
        at_least("num_buckets", self.num_buckets, 2)
        between("num_channels", self.num_channels, 1, 4096)
        between("num_shards", self.num_shards, 1, 64)
        at_least("max_replays", self.max_replays, 0)
        at_least("replay_backoff_initial_s", self.replay_backoff_initial_s, 0.0)
        at_least("replay_backoff_multiplier", self.replay_backoff_multiplier, 1.0)
        at_least("replay_backoff_max_s", self.replay_backoff_max_s, self.replay_backoff_initial_s)
        positive("max_batch_s", self.max_batch_s)
        at_least("sink_retry_budget_s", self.sink_retry_budget_s, 0.0)
        at_least("max_pending", self.max_pending, 1)
        at_least("waitaof_timeout_ms", self.waitaof_timeout_ms, 1)
        between("flush_batch_size", self.flush_batch_size, 1, 1_000_000)
        between("ingest_batch_records", self.ingest_batch_records, 1, 1_000_000)
        between("sink_ack_every_records", self.sink_ack_every_records, 0, 1_000_000)
        positive("outage_budget_s", self.outage_budget_s)
        between("metrics_port", self.metrics_port, 0, 65535)
        if not self.state_dir.strip():
            bad("state_dir", self.state_dir, f"a directory path, or {TEMP_STATE_DIR!r} for a temporary one")
        if not self.metrics_host.strip() or any(c.isspace() for c in self.metrics_host):
            bad("metrics_host", self.metrics_host, "a host name or IP address without spaces")

    def __repr__(self) -> str:
        """Like the dataclass repr, with the password of ``redis_url`` masked (configs end up in logs)."""

        shown = ", ".join(
            f"{f.name}={mask_url(self.redis_url) if f.name == 'redis_url' else getattr(self, f.name)!r}"
            for f in fields(self)
        )
        return f"FTConfig({shown})"

    @property
    def ft_on(self) -> bool:
        """True when the FT status is 'on'."""
        return self.status == "on"

    @property
    def state_temporary(self) -> bool:
        """True when ``state_dir`` asks for a temporary directory (``':temp:'``)."""
        return self.state_dir == TEMP_STATE_DIR

    @property
    def metrics_on(self) -> bool:
        """True when a metrics port is configured (metrics_port > 0)."""
        return self.metrics_port > 0

    @property
    def rotation_interval_s(self) -> float:
        """Seconds between bucket rotations: timeout_s / (num_buckets - 1)."""
        return self.timeout_s / (self.num_buckets - 1)

    @property
    def explicit_options(self) -> frozenset[str]:
        """Options set in code (constructor keywords, ``load`` overrides, ``replace`` changes)."""
        explicit: frozenset[str] = getattr(self, "_explicit", frozenset())
        return explicit

    def replace(self, **changes: Any) -> FTConfig:
        """A copy with some options changed, validated like a new instance; the changes count as set in code."""
        return self._copy(changes, self.explicit_options | frozenset(changes))

    def _copy(self, changes: dict[str, Any], explicit: frozenset[str]) -> FTConfig:
        new = dataclasses.replace(self, **changes)
        object.__setattr__(new, "_explicit", explicit)
        return new

    def with_spark_conf(self, spark_conf: Mapping[str, str]) -> FTConfig:
        """This config with the ``spark.ftlayer.*`` keys of ``spark_conf`` applied to every option not set in code.

        Unknown ``spark.ftlayer.*`` keys and bad values are refused with a
        :class:`ConfigError` naming the key. Other keys are ignored. Options in
        :attr:`explicit_options` keep their value: code wins over Spark conf.
        Returns ``self`` when nothing changes.
        """
        parsed = spark_values(spark_conf, {f.name: f for f in fields(self)})
        changes = {k: v for k, (v, _) in parsed.items() if k not in self.explicit_options and v != getattr(self, k)}
        if not changes:
            return self
        origins = {k: where for k, (_, where) in parsed.items()}
        with naming_origin(origins):
            return self._copy(changes, self.explicit_options)

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        spark_conf: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> FTConfig:
        """Build a config from defaults, TOML file, env and Spark conf (in rising precedence).

        ``path`` defaults to ``$FTLAYER_CONFIG``, then ``./ftlayer.toml`` if it
        exists. The TOML may hold the options at top level or in an
        ``[ftlayer]`` table. Unknown option names in the file or in Spark conf
        are refused (a typo would otherwise be silently ignored). Keyword
        ``overrides`` win over everything and count as set in code
        (:attr:`explicit_options`). A bad value's error names where it came
        from (file, env var or Spark conf key).
        """
        return cls.explain(path, env=env, spark_conf=spark_conf, **overrides)[0]

    @classmethod
    def explain(
        cls,
        path: str | Path | None = None,
        *,
        env: Mapping[str, str] | None = None,
        spark_conf: Mapping[str, str] | None = None,
        overrides_origin: str = "code",
        **overrides: Any,
    ) -> tuple[FTConfig, dict[str, str]]:
        """Like :meth:`load`, plus where each option's value came from.

        The origin of an option is ``"default"``, ``"file <path>"``,
        ``"env FTLAYER_<NAME>"``, ``"Spark conf spark.ftlayer.<name>"`` or
        ``overrides_origin`` (e.g. ``"command line"``) for ``overrides``.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        origins: dict[str, str] = {}
        file_path = config_path(path, env)
        if file_path is not None:
            table = read_toml(file_path)
            values.update(table)
            origins.update(dict.fromkeys(table, f"file {file_path}"))
        known = {f.name: f for f in fields(cls)}
        for name, (value, where) in (env_values(env, known) | spark_values(spark_conf or {}, known)).items():
            values[name] = value
            origins[name] = where
        values.update(overrides)
        origins.update(dict.fromkeys(overrides, overrides_origin))
        unknown = sorted(set(values) - set(known))
        with naming_origin({k: v for k, v in origins.items() if k not in overrides}):
            if unknown:
                bad(unknown[0], values[unknown[0]], f"one of the options {sorted(known)}")
            cfg = cls(**values)
        object.__setattr__(cfg, "_explicit", frozenset(overrides))
        return cfg, {name: origins.get(name, "default") for name in known}

    def describe(self) -> list[tuple[str, str, str, str]]:
        """(option, env var, Spark conf key, doc) for every option; used by docs and CLI help."""
        return [
            (f.name, ENV_PREFIX + f.name.upper(), SPARK_PREFIX + f.name, f.metadata["doc"])
            for f in fields(self)
        ]

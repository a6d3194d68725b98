"""The FT source's options: parsed and validated once, on the driver and in every reader.

Options (all strings, as Spark passes them): ``redis_url`` (required; executors
never start an embedded server), ``namespace``, ``topology``, ``source``,
``num_channels``, and optionally ``max_records_per_batch``, ``read_page_entries``
(stream entries of the first server-side read call of a partition, default 8;
later calls double or halve it, up to 4096, aiming at about 10,000 records per
call, since one entry holds the ids of one persist call, 1 to
``flush_batch_size`` of them), ``connect_timeout_s`` and ``outage_budget_s``
(default 300: every Redis command of the source, in the source runner and in
``read``, waits out an outage with backoff for up to that many seconds before
it raises; see :mod:`ftlayer.store.outage`).

Further options the compiler and ``ftlayer.read_stream`` pass from the source's ``FTConfig``
(:func:`source_options`): ``num_shards``, ``freeze_worker_heap``, ``max_batch_s`` and
``hold_lease_s``. Every option is read under its camelCase or snake_case name in any case
(:mod:`runtime.spark.option_names`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ftlayer.acker.holds import hold_lease_s
from ftlayer.config import FTConfig, parse_bool
from ftlayer.errors import ConfigError
from ftlayer.keyspace.keys import check_name
from runtime.spark.option_names import FT_FORMAT, SourceOptionMap, camel_case

__all__ = ["DEFAULT_READ_PAGE_ENTRIES", "FORMAT", "MAX_READ_PAGE_ENTRIES", "FTSourceOptions", "source_options"]

FORMAT = FT_FORMAT
DEFAULT_READ_PAGE_ENTRIES = 8  # first page of a read; later pages adapt (runtime.spark.ft_channel_read)
MAX_READ_PAGE_ENTRIES = 4096
DEFAULT_OUTAGE_BUDGET_S = FTConfig().outage_budget_s
DEFAULT_MAX_BATCH_S = FTConfig().max_batch_s


@dataclass(frozen=True)
class FTSourceOptions:
    """The FT source's options, parsed and validated. Picklable."""

    redis_url: str
    namespace: str
    topology: str
    source: str
    num_channels: int
    max_records_per_batch: int | None = None
    read_page_entries: int = DEFAULT_READ_PAGE_ENTRIES
    connect_timeout_s: float = 5.0
    outage_budget_s: float = DEFAULT_OUTAGE_BUDGET_S
    num_shards: int = 1
    freeze_worker_heap: bool = True  # FTConfig.freeze_worker_heap, applied in the read tasks
    max_batch_s: float = DEFAULT_MAX_BATCH_S  # FTConfig.max_batch_s: the longest hold of a batch
    hold_lease_s: float = 10.0  # how far one renewal moves a hold (ftlayer.acker.holds.hold_lease_s)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> FTSourceOptions:
        """Parse Spark's (string-valued) options, each under its camelCase or snake_case name in
        any case (``maxRecordsPerBatch`` = ``max_records_per_batch``); ConfigError names a bad one."""
        opts = SourceOptionMap(options, "FT source")

        def required(name: str) -> str:
            value = opts.get(name, "").strip()
            if not value:
                msg = f"FT source option {camel_case(name)!r} ({name}) is required (format {FORMAT!r})"
                raise ConfigError(msg)
            return value

        def integer(name: str, value: str, low: int, high: int) -> int:
            try:
                parsed = int(value.strip().replace("_", ""))
            except ValueError:
                parsed = low - 1
            if not low <= parsed <= high:
                msg = f"invalid FT source option {name}={value!r}: expected an integer from {low} to {high}"
                raise ConfigError(msg)
            return parsed

        url = required("redis_url")
        topology = check_name("topology", required("topology"))
        source = check_name("source", required("source"))
        num_channels = integer("num_channels", required("num_channels"), 1, 4096)
        raw_max = opts.get("max_records_per_batch", "").strip()
        max_records = integer("max_records_per_batch", raw_max, 1, 2**62) if raw_max else None
        raw_page = opts.get("read_page_entries", "").strip()
        page = DEFAULT_READ_PAGE_ENTRIES
        if raw_page:
            page = integer("read_page_entries", raw_page, 1, MAX_READ_PAGE_ENTRIES)
        def seconds(name: str, default: float) -> float:
            if not opts.get(name, "").strip():
                return default
            try:
                return float(opts[name])
            except ValueError as exc:
                msg = f"invalid FT source option {name}={opts[name]!r}: expected seconds"
                raise ConfigError(msg) from exc

        timeout = seconds("connect_timeout_s", 5.0)
        budget = seconds("outage_budget_s", DEFAULT_OUTAGE_BUDGET_S)
        raw_shards = opts.get("num_shards", "").strip()
        shards = integer("num_shards", raw_shards, 1, 64) if raw_shards else 1
        freeze = parse_bool("freeze_worker_heap", opts.get("freeze_worker_heap", "true"), "FT source options")
        max_batch = seconds("max_batch_s", DEFAULT_MAX_BATCH_S)
        lease = seconds("hold_lease_s", 10.0)
        if max_batch <= 0 or lease <= 0:
            msg = f"invalid FT source options max_batch_s={max_batch!r}, hold_lease_s={lease!r}: expected > 0"
            raise ConfigError(msg)
        parsed = cls(url, required("namespace"), topology, source, num_channels, max_records, page, timeout, budget,
                     shards, freeze, max_batch, lease)
        parsed.config()  # validates redis_url, namespace, the timeout and the budget
        return parsed

    def config(self) -> FTConfig:
        """The FTConfig the source's Redis handle is built from."""
        return FTConfig(
            redis_url=self.redis_url, namespace=self.namespace, connect_timeout_s=self.connect_timeout_s,
            outage_budget_s=self.outage_budget_s, num_shards=self.num_shards,
        )


def source_options(config: FTConfig, topology: str, source: str, num_channels: int, *,
                   max_records_per_batch: int | None = None, read_page_entries: int | None = None) -> dict[str, str]:
    """The FT source's options for a resolved ``config`` (validated here, not in a Spark worker)."""
    options = {
        "redis_url": config.redis_url,
        "namespace": config.namespace,
        "topology": topology,
        "source": source,
        "num_channels": str(num_channels),
        "num_shards": str(config.num_shards),
        "connect_timeout_s": repr(config.connect_timeout_s),
        "outage_budget_s": repr(config.outage_budget_s),
        "freeze_worker_heap": str(config.freeze_worker_heap).lower(),
        "max_batch_s": repr(config.max_batch_s),
        "hold_lease_s": repr(hold_lease_s(config.rotation_interval_s)),
    }
    if max_records_per_batch is not None:
        options["max_records_per_batch"] = str(max_records_per_batch)
    if read_page_entries is not None:
        options["read_page_entries"] = str(read_page_entries)
    FTSourceOptions.parse(options)
    return options

"""Redis, effectively once: each output is one hash field named by its lineage id, written once.

``HSETNX <key> <lineage id> <value>``: the first write of an output creates the field, every later
write of it (a replay, a task retry, Spark re-running an uncommitted batch) finds the field and
changes nothing, so a reader of the hash sees each output exactly once, with the value of its
first write. Write-once rather than overwrite: a replay that computes a different value (a row
function that reads the clock) cannot change what a reader already saw.

- Topology path: :class:`RedisOnceSink`, an ``ExecutorSink``: ``key_fn(value)`` names the hash
  (default: one hash for the whole sink), fields are ``SinkContext.lineages``.
- DataFrame path: :func:`redis_sink`, a ``foreachBatch`` function to wrap in ``ftlayer.acking``;
  each executor writes its partition's rows as JSON objects (``runtime.idempotent.keyed`` picks
  the columns), pipelined in one round trip per 1,000 rows.

Bounds: one field per output, kept until the user deletes the hash; a hash of many millions of
fields wants a ``key_fn`` that spreads them (per day, per user). Every write is retried by
redis-py on a dropped connection (``ftlayer.store.connection.client_for``); a retried ``HSETNX`` is
harmless. Returns of both: the number of fields newly written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ftlayer.logs import logger_for
from runtime.idempotent.keyed import DEFAULT_LINEAGE, keyed_rows
from runtime.sinks import RedisUrlSink, SinkContext

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["RedisOnceSink", "redis_sink", "write_once"]

log = logger_for(__name__)
_KEY = "_lineage_id"  # the column keyed_rows puts the lineage id in; not written into the value
_PIPELINE_ROWS = 1000


def write_once(url: str, items: list[tuple[str, str, str]]) -> int:
    """``HSETNX key field value`` for each ``(key, field, value)``; the number of fields created."""
    from ftlayer.store.connection import client_for

    client = client_for(url)
    created = 0
    for start in range(0, len(items), _PIPELINE_ROWS):
        pipe = client.pipeline(transaction=False)
        for key, field, value in items[start : start + _PIPELINE_ROWS]:
            pipe.hsetnx(key, field, value)
        created += sum(int(r) for r in pipe.execute())
    return created


class RedisOnceSink(RedisUrlSink):
    """Topology sink: ``HSETNX key_fn(v) <lineage id> value_fn(v)`` per value (see module).

    ``url`` defaults to the topology's FT server (set before start, as for ``RedisHashSink``).
    """

    def __init__(self, key: str | Callable[[Any], str], value_fn: Callable[[Any], str] = json.dumps, *,
                 url: str | None = None) -> None:
        self.key_fn: Callable[[Any], str] = key if callable(key) else _Constant(key)
        self.value_fn, self.url = value_fn, url
        self.created = 0  # fields this copy created (per executor task; for tests and logs)

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        if len(ctx.lineages) != len(values):
            msg = f"RedisOnceSink: {len(values)} values but {len(ctx.lineages)} lineage ids in the sink context"
            raise ValueError(msg)
        assert self.url is not None, "RedisOnceSink.url is set by the topology before start"
        items = [(self.key_fn(v), lid, self.value_fn(v)) for v, lid in zip(values, ctx.lineages, strict=True)]
        self.created += write_once(self.url, items)


@dataclass(frozen=True)
class _Constant:
    key: str

    def __call__(self, _value: Any) -> str:
        return self.key


def _write_partition(url: str, key: str, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body, in the executor: the partition's rows, written once each; yields counts."""
    import pyarrow as pa

    items: list[tuple[str, str, str]] = []
    for batch in batches:
        for row in batch.to_pylist():
            lineage = row.pop(_KEY)
            items.append((key, lineage, json.dumps(row, default=str, sort_keys=True)))
    created = write_once(url, items) if items else 0
    yield pa.RecordBatch.from_pydict({"rows": [len(items)], "created": [created]})


@dataclass(frozen=True)
class _RedisBatchSink:
    """The ``foreachBatch`` function :func:`redis_sink` returns (plain data: picklable)."""

    url: str
    key: str
    lineage: str
    columns: tuple[str, ...] | None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        rows = keyed_rows(df, "redis_sink", key=_KEY, lineage=self.lineage, columns=self.columns)
        counts = rows.mapInArrow(partial(_write_partition, self.url, self.key), "rows long, created long").collect()
        total, created = sum(r["rows"] for r in counts), sum(r["created"] for r in counts)
        log.info("batch %d: %d rows to hash %r, %d new, %d already there", batch_id, total, self.key,
                 created, total - created)


def redis_sink(url: str, key: str, *, lineage: str = DEFAULT_LINEAGE,
               columns: list[str] | None = None) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function writing each row once into the hash ``key`` at ``url``:
    field = the row's lineage id, value = the row's columns (``columns``, else all but
    ``_ftlayer``) as a JSON object. Wrap it in ``ftlayer.acking``. Rows made from one record (an
    ``explode``) share its lineage id and only the first is kept: add the position first."""
    return _RedisBatchSink(url, key, lineage, tuple(columns) if columns is not None else None)

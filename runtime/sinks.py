"""Sinks: write, then ack. A record is acked only after the write that holds it succeeded.

Executor sinks run as the last stage of the query, inside Spark tasks: for each
Arrow batch they decode the values once, call ``write(values, ctx)``, and on
success ack every record of the batch (XOR its current id out, together with
the deltas its upstream operators put on the row). If ``write``
raises, every record of the batch fails with the traceback as reason and is
replayed (dead-lettered after ``max_replays``); the query keeps running. The
task flushes its acks and the carried deltas once, with an idempotent token:
this is the one acker update of the records it received.

- :class:`CallableSink`: your function gets each batch's values.
- :class:`JsonLinesSink`: one JSON-lines file per batch and attempt, written to
  a temporary name and renamed, so readers never see a partial file. With
  ``with_meta`` each line is ``{"origin", "replay", "partition", "value"}``.
- :class:`RedisHashSink`: ``HSET key field value`` per record, pipelined.

:class:`ForeachBatchSink` runs on the driver (Spark's ``foreachBatch``): your
function gets the whole micro-batch's values and the batch id; the driver acks
after it returns. Sinks must be picklable (they ship to executors).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CallableSink", "ExecutorSink", "ForeachBatchSink", "JsonLinesSink", "RedisHashSink", "RedisUrlSink", "SinkContext",
]


@dataclass(frozen=True)
class SinkContext:
    """Where a write happens: micro-batch id, Spark partition, task attempt, and per value
    its origin id, source record id (they differ exactly when the record is a replay) and
    lineage id.

    ``lineages[i]`` is the lineage id of ``values[i]`` (``ftlayer.records.lineage``): the same on every
    replay, task retry and restart, different for every other output. An effectively-once
    sink writes each value under it with a unique constraint (``runtime.idempotent``).
    """

    batch_id: str
    partition: int
    attempt: int
    origins: list[int] = field(default_factory=list)
    sids: list[int] = field(default_factory=list)
    lineages: list[str] = field(default_factory=list)


class ExecutorSink:
    """Base of sinks that write inside Spark tasks. Subclasses implement ``write``."""

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        raise NotImplementedError

    def after_flush(self, ctx: SinkContext) -> None:
        """Called once per task after its acks were flushed (a hook for metrics and fault tests)."""


class CallableSink(ExecutorSink):
    """Calls ``fn(values)`` (or ``fn(values, ctx)`` with ``pass_context``) for each batch."""

    def __init__(self, fn: Callable[..., Any], *, pass_context: bool = False) -> None:
        self.fn = fn
        self.pass_context = pass_context

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        if self.pass_context:
            self.fn(values, ctx)
        else:
            self.fn(values)


class JsonLinesSink(ExecutorSink):
    """Writes ``<directory>/part-<batch>-p<partition>-a<attempt>-<uuid>.jsonl`` atomically.

    A relative ``directory`` is taken relative to the working directory where the sink is built (the
    driver's), as Spark's own writers qualify a relative path: the executors' working directories
    differ from it (a ``local-cluster`` or cluster executor runs in a work directory of its own).
    """

    def __init__(self, directory: str | Path, *, with_meta: bool = True) -> None:
        self.directory = os.path.abspath(directory)
        self.with_meta = with_meta

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        if not values:
            return
        os.makedirs(self.directory, exist_ok=True)
        name = f"part-{ctx.batch_id}-p{ctx.partition}-a{ctx.attempt}-{uuid.uuid4().hex[:8]}.jsonl"
        final = Path(self.directory, name)
        tmp = Path(self.directory, "." + name + ".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            lineages = ctx.lineages or [""] * len(values)
            for origin, sid, lineage, value in zip(ctx.origins, ctx.sids, lineages, values, strict=True):
                line = (
                    {"origin": origin, "replay": sid != origin, "lineage": lineage, "partition": ctx.partition,
                     "value": value}
                    if self.with_meta
                    else value
                )
                fh.write(json.dumps(line, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        tmp.rename(final)

    def read_all(self) -> list[Any]:
        """Every line written so far (for reports and tests)."""
        out: list[Any] = []
        for path in sorted(Path(self.directory).glob("part-*.jsonl")):
            out.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())
        return out


class RedisUrlSink(ExecutorSink):
    """Base of sinks that write to Redis: ``url`` None means the topology's own server (the
    compiler sets it before start, FT off too)."""

    url: str | None = None


class RedisHashSink(RedisUrlSink):
    """``HSET key_fn(v) field_fn(v) value_fn(v)`` for each record; ``url`` defaults to the FT server."""

    def __init__(
        self,
        key_fn: Callable[[Any], str],
        field_fn: Callable[[Any], str],
        value_fn: Callable[[Any], Any] = json.dumps,
        *,
        url: str | None = None,
    ) -> None:
        self.key_fn, self.field_fn, self.value_fn, self.url = key_fn, field_fn, value_fn, url

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        from ftlayer.store.connection import client_for

        assert self.url is not None, "RedisHashSink.url is set by the topology before start"
        pipe = client_for(self.url).pipeline(transaction=False)
        for v in values:
            pipe.hset(self.key_fn(v), self.field_fn(v), self.value_fn(v))
        pipe.execute()


class ForeachBatchSink:
    """Driver-side sink: ``fn(values, batch_id)`` per micro-batch, then the driver acks."""

    def __init__(self, fn: Callable[[list[Any], int], Any]) -> None:
        self.fn = fn

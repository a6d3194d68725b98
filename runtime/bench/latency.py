"""Complete latency under steady load: from a record's persist to its ack, at a fixed trigger interval.

What is measured, per source record: ``ack - stamp`` in milliseconds, where

- **stamp** is ``time.time()`` taken by the paced source at the moment it hands
  the record to ingest (the value carries it as ``"t"``). Records carry no
  persist time in Redis (memory budget), so this is the closest honest point:
  the ingestor persists in batches (``linger_s`` 20 ms, or when the source goes
  idle), so the stamp precedes the persist by at most linger + one persist call
  (plus any backpressure wait, which this load never reaches: see
  ``source_lag_max_ms``). The figure is therefore an **upper bound** of
  persist -> ack.
- **ack** is ``time.time()`` in the sink task right after the task flushed its
  acks to Redis (``ExecutorSink.after_flush``): the moment the record's XOR
  tree returned to 0 (the operators in front of the keyed shuffle flushed their
  XORs in the previous stage). A record delivered more than once (a replay)
  counts with its first ack. Executors and driver run on one machine, so the
  two clocks are the same clock.

The load: a source that emits ``rate_per_s`` records per second on a fixed
schedule (record i is due at ``start + i / rate``), through the e2e bench's
topology (source -> map -> key_by(user) -> map -> sink, FT on), started with
``trigger_interval_s``. A micro-batch engine picks a record up at the next
trigger and acks it when that batch's tasks finish, so the latency is about
the wait for the trigger (0..T) plus one batch's duration; the issue's aim is
p99 <= 2 T.

Warm-up: the records of the query's start-up are not measured. While Spark
starts, a backlog builds up (seconds of load, up to ``max_pending`` records),
and each later batch takes all that is waiting. Measurement starts once
``warmup_s`` has passed *and* the backlog is through: at the first ack a mark
is set; whenever a record stamped after the newest mark is acked, a new mark
is set; after ``SETTLE_ROUNDS`` such rounds (each shrinks the backlog by the
ratio load / capacity) the pipeline is taken as steady. Then
``round(rate * duration_s)`` records are measured. The result
also shows whether the load was steady: the source's lag behind its schedule,
the ingest and ack rates over the measured records, the p50 of the first and
second half of the window (a growing latency means the load exceeds capacity)
and the durations of the micro-batches in the window.

A run that did not drain, or in which any emitted record never reached the
sink, raises :class:`LatencyBenchError` instead of reporting a latency.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
import uuid
from array import array
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.servers.process_server import resolved
from ftlayer.store.connection import client_for
from runtime.bench.common import delete_namespace
from runtime.bench.e2e import first_map, make_value, second_map
from runtime.sinks import ExecutorSink, SinkContext
from runtime.topology import Topology

STARTUP_LIMIT_S = 180.0  # the query must ack its first post-start-up record within this many seconds
SETTLE_ROUNDS = 3  # catch-up rounds after the first ack before measuring (see the module docstring)
ACK_GRACE_S = 15.0  # after the drain, how long the last tasks' latency reports may take to arrive


class LatencyBenchError(FTLayerError):
    """The latency run did not produce a trustworthy figure (no drain, lost records, query failed)."""


class PacedSource:
    """A poll-style source emitting ``{"i", "user", "page", "t"}`` at ``rate_per_s`` on a fixed schedule.

    Phases: warm-up (until ``warmup_s`` passed and :meth:`mark_ready` was called),
    then ``measured`` records, then the end (``poll`` returns None). The index
    range of the measured records is ``measure_from .. measure_to - 1``.
    """

    def __init__(self, rate_per_s: float, warmup_s: float, measured: int) -> None:
        self.rate = rate_per_s
        self.warmup_s = warmup_s
        self.measured = measured
        self.next = 0
        self.t0 = 0.0
        self.measure_from: int | None = None
        self.measure_to: int | None = None
        self.measure_start_wall = 0.0  # time.time() when measurement began
        self.measure_start_s = 0.0  # seconds from open() to the start of measurement
        self.lag_max_s = 0.0  # largest delay of a measured record behind its schedule
        self.finished = threading.Event()
        self._ready = threading.Event()

    def mark_ready(self) -> None:
        """The pipeline is through its start-up; measurement may begin once ``warmup_s`` passed."""
        self._ready.set()

    def open(self) -> None:
        self.t0 = time.monotonic()

    def poll(self) -> list[dict[str, Any]] | None:
        now = time.monotonic()
        if self.measure_from is None and now - self.t0 >= self.warmup_s and self._ready.is_set():
            self.measure_from, self.measure_to = self.next, self.next + self.measured
            self.measure_start_wall = time.time()
            self.measure_start_s = now - self.t0
        if self.measure_to is not None and self.next >= self.measure_to:
            self.finished.set()
            return None
        due = int((now - self.t0) * self.rate) + 1  # records 0 .. due-1 are due by now
        if self.measure_to is not None:
            due = min(due, self.measure_to)
        if due <= self.next:
            return []  # idle: the ingestor persists what it holds and sleeps linger_s
        if self.measure_from is not None:
            self.lag_max_s = max(self.lag_max_s, now - (self.t0 + self.next / self.rate))
        stamp = time.time()
        out = [{**make_value(i, 0), "t": stamp} for i in range(self.next, due)]
        self.next = due
        return out

    def close(self) -> None:
        self.finished.set()


class LatencySink(ExecutorSink):
    """Keeps (i, stamp) of each written value; after the task's ack flush, reports (i, stamp, ack time).

    Reports go to the Redis list ``key`` as packed native doubles, one
    ``RPUSH`` per task. Holds the URL, not a client, so it pickles.
    """

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
        self._written: list[float] = []

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        for v in values:
            self._written.extend((float(v["i"]), float(v["t"])))

    def after_flush(self, ctx: SinkContext) -> None:
        acked = time.time()  # the task's acks are in Redis now
        if not self._written:
            return
        out = array("d")
        for j in range(0, len(self._written), 2):
            out.extend((self._written[j], self._written[j + 1], acked))
        self._written = []
        client_for(self.url).rpush(self.key, out.tobytes())


class Collector:
    """Driver side: reads the sink's reports incrementally; first ack per record index."""

    def __init__(self, url: str, key: str) -> None:
        self.client = client_for(url)
        self.key = key
        self.seen = 0  # list entries read so far
        self.first: dict[int, tuple[float, float]] = {}  # i -> (stamp, ack)
        self.deliveries: dict[int, int] = {}
        self.marks: list[float] = []  # wall times: the first report, then each catch-up (see module notes)
        self.newest_stamp = 0.0

    def poll(self) -> None:
        chunks: list[bytes] = self.client.lrange(self.key, self.seen, -1)  # type: ignore[assignment]
        if not chunks:
            return
        now = time.time()
        if not self.marks:
            self.marks.append(now)
        self.seen += len(chunks)
        for chunk in chunks:
            vals = array("d")
            vals.frombytes(chunk)
            for j in range(0, len(vals), 3):
                i, stamp, acked = int(vals[j]), vals[j + 1], vals[j + 2]
                self.deliveries[i] = self.deliveries.get(i, 0) + 1
                if i not in self.first or acked < self.first[i][1]:
                    self.first[i] = (stamp, acked)
                self.newest_stamp = max(self.newest_stamp, stamp)
        if self.newest_stamp >= self.marks[-1]:  # a record emitted after the newest mark is acked
            self.marks.append(now)

    def past_startup(self) -> bool:
        """``SETTLE_ROUNDS`` catch-up rounds after the first ack: the start-up backlog is through."""
        return len(self.marks) > SETTLE_ROUNDS


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of an ascending, non-empty list."""
    k = max(0, math.ceil(q / 100.0 * len(sorted_values)) - 1)
    return sorted_values[k]


def _batches(progress: list[Any], since_wall: float) -> dict[str, Any]:
    """The micro-batches with input that started after ``since_wall``: count, median and max duration
    (ms), median input rows, and the median of each phase Spark times (``durationMs``: addBatch is the
    tasks, latestOffset / queryPlanning / walCommit / commitOffsets the driver's bookkeeping)."""
    picked = [p for p in progress
              if datetime.fromisoformat(str(p.timestamp).replace("Z", "+00:00")).timestamp() >= since_wall
              and int(p.numInputRows) > 0]
    if not picked:
        return {"count": 0, "median_ms": 0.0, "max_ms": 0.0, "median_rows": 0, "phases_median_ms": {}}
    total = [float(p.durationMs.get("triggerExecution", 0)) for p in picked]
    phases = sorted({k for p in picked for k in p.durationMs if k != "triggerExecution"})
    return {
        "count": len(picked),
        "median_ms": statistics.median(total),
        "max_ms": max(total),
        "median_rows": statistics.median(int(p.numInputRows) for p in picked),
        "phases_median_ms": {k: statistics.median(float(p.durationMs.get(k, 0)) for p in picked) for k in phases},
    }


def summarize(collector: Collector, source: PacedSource) -> dict[str, Any]:
    """Latency percentiles (ms) and steadiness figures of the measured records; raises if any is missing."""
    assert source.measure_from is not None and source.measure_to is not None
    lost = [i for i in range(source.next) if i not in collector.first]
    if lost:
        msg = f"{len(lost)} of {source.next} emitted records never reached the sink (first: i={lost[0]})"
        raise LatencyBenchError(msg)
    idx = range(source.measure_from, source.measure_to)
    pairs = [collector.first[i] for i in idx]
    lat_ms = [(acked - stamp) * 1000.0 for stamp, acked in pairs]
    ordered = sorted(lat_ms)
    half = len(lat_ms) // 2
    stamps = [s for s, _ in pairs]
    acks = sorted(a for _, a in pairs)
    span_in = max(stamps) - min(stamps)
    span_ack = acks[-1] - acks[0]
    return {
        "count": len(lat_ms),
        "deliveries": sum(collector.deliveries[i] for i in idx),
        "p50_ms": round(percentile(ordered, 50), 2),
        "p90_ms": round(percentile(ordered, 90), 2),
        "p99_ms": round(percentile(ordered, 99), 2),
        "max_ms": round(ordered[-1], 2),
        "mean_ms": round(statistics.fmean(ordered), 2),
        "ingested_per_s": round((len(pairs) - 1) / span_in, 1) if span_in > 0 else 0.0,
        "acked_per_s": round((len(pairs) - 1) / span_ack, 1) if span_ack > 0 else 0.0,
        "p50_first_half_ms": round(statistics.median(lat_ms[:half] or lat_ms), 2),
        "p50_second_half_ms": round(statistics.median(lat_ms[half:]), 2),
        "source_lag_max_ms": round(source.lag_max_s * 1000.0, 2),
    }


def _wait_measured(query: Any, source: PacedSource, collector: Collector, say: Callable[[str], None],
                   *, trigger_s: float, measure_s: float) -> None:
    """Drive the run until the source ended: mark readiness; fail fast on a dead query, a stuck
    start-up, or a measured phase that takes far longer than ``measure_s`` (the load was not steady)."""
    started = time.monotonic()
    last_say = started
    while not source.finished.is_set():
        failure = query.query.exception()
        if failure is not None:
            msg = f"latency run (trigger {trigger_s} s): the streaming query failed: {failure}"
            raise LatencyBenchError(msg) from failure
        collector.poll()
        if source.measure_from is not None:
            if time.monotonic() - source.t0 - source.measure_start_s > 2 * measure_s + 60.0:
                msg = (f"latency run (trigger {trigger_s} s): the source is far behind its schedule "
                       f"(ingest blocked by backpressure?), {source.next:,} records emitted")
                raise LatencyBenchError(msg)
        elif collector.past_startup():
            source.mark_ready()
        elif time.monotonic() - started > STARTUP_LIMIT_S:
            msg = f"latency run (trigger {trigger_s} s): no start-up within {STARTUP_LIMIT_S:.0f} s"
            raise LatencyBenchError(msg)
        if time.monotonic() - last_say >= 5.0:
            last_say = time.monotonic()
            phase = "warm-up" if source.measure_from is None else "measuring"
            say(f"  {phase}: {source.next:,} emitted, {len(collector.first):,} acked")
        time.sleep(0.1)


def bench_latency(
    spark: Any,
    config: FTConfig,
    *,
    rate_per_s: float = 2000,
    duration_s: float = 30.0,
    warmup_s: float = 5.0,
    trigger_interval_s: float = 1.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """One steady-load run; returns the complete latency (see the module docstring for what is measured).

    ``config`` needs no namespace: a fresh one is used and every key under it
    is deleted afterwards (FT is switched on). ``progress`` gets a line every
    few seconds. Returns ``p50_ms``, ``p90_ms``, ``p99_ms``, ``max_ms``,
    ``count`` (measured records), ``p99_over_trigger`` (p99 / trigger
    interval), the offered, ingested and acked rates (records/s) and the
    steadiness figures. Raises :class:`LatencyBenchError` if the run did not
    drain or lost a record.
    """
    say = progress or (lambda _msg: None)
    cfg = resolved(config.replace(status="on", namespace="lat" + uuid.uuid4().hex[:10], state_dir=TEMP_STATE_DIR))
    url = cfg.redis_url
    key = f"{cfg.namespace}:bench:latency"
    measured = max(1, round(rate_per_s * duration_s))
    source = PacedSource(rate_per_s, warmup_s, measured)
    collector = Collector(url, key)
    topo = Topology("latency", cfg)
    (topo.source("events", source).map(first_map).key_by(lambda e: e["user"]).map(second_map)
     .sink(LatencySink(url, key)))
    say(f"latency: {rate_per_s:,.0f} records/s, trigger {trigger_interval_s} s, "
        f"{duration_s} s measured after >= {warmup_s} s warm-up")
    try:
        query = topo.start(spark, trigger_interval_s=trigger_interval_s)
        try:
            _wait_measured(query, source, collector, say, trigger_s=trigger_interval_s, measure_s=duration_s)
            if not query.await_drained(cfg.timeout_s + 60.0, poll_s=0.1):
                msg = f"latency run (trigger {trigger_interval_s} s) did not drain: {query.stats()}"
                raise LatencyBenchError(msg)
            deadline = time.monotonic() + ACK_GRACE_S
            while len(collector.first) < source.next and time.monotonic() < deadline:
                collector.poll()  # the last tasks report right after their flush, maybe after the drain
                time.sleep(0.05)
            batches = _batches(list(query.query.recentProgress), source.measure_start_wall)
            ft_stats = next(iter(query.stats().values()))
        finally:
            query.stop()
        result = summarize(collector, source)
    finally:
        delete_namespace(url, cfg.namespace)
    return {
        "namespace": cfg.namespace,
        "trigger_interval_s": trigger_interval_s,
        "offered_per_s": rate_per_s,
        "duration_s": duration_s,
        "warmup_s": round(source.measure_start_s, 2),
        **result,
        "p99_over_trigger": round(result["p99_ms"] / (trigger_interval_s * 1000.0), 3),
        "batches": batches,
        "ft_stats": ft_stats,
        "method": "stamp when the source hands the record to ingest (<= persist) to the sink task's "
                  "ack flush: an upper bound of persist -> ack",
    }

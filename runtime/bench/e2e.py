"""End-to-end throughput on local Spark: FT on, FT off, and plain Structured Streaming.

All three run the same logical topology on the same input: N small click
records (or 1 KiB payloads) -> map -> key_by(user) -> map -> a sink that
discards. Variants alternate inside one process (one SparkSession), each is
repeated, and the figure is records per second from ``start()`` until the
last record was processed (query start-up included in every variant alike).
Beside it, each variant's CPU per record over the same span: every process of
the machine (the JVM, Python workers, a source's runner, Redis, the driver),
from ``/proc/stat`` (:class:`runtime.bench.common.Stopwatch`). On two cores
these jobs keep busy, a ratio of rates follows the inverse ratio of CPU.

- ``ft-on``: the ftlayer Topology with status on (persist, XOR, ack).
- ``ft-off``: the same Topology with status off (no persistence, no XOR).
- ``plain``: hand-written PySpark with no ftlayer at all: the
  ``rate-micro-batch`` source, ``mapInArrow`` for each map and ``repartition``
  by user, a ``noop`` sink. Its Python workers collect garbage as PySpark
  ships them (a full ``gc.collect()`` after every task, 55 ms here for the
  75,000 objects a worker holds), so it undoes any frozen heap an ftlayer run
  left in a shared worker (:func:`runtime.bench.common.as_shipped`).
- ``plain-frozen``: the same hand-written job with the worker-heap freeze that
  ftlayer's tasks apply (:mod:`runtime.spark.worker_heap`), for reference: how
  much of the gap to plain PySpark that one trick closes, and what is left.
- ``python-frozen``: ``plain-frozen`` with its rows from a trivial PySpark Python
  data source (:mod:`runtime.bench.python_source`) instead of ``rate-micro-batch``,
  as ftlayer's rows come: what any Python source costs in PySpark
  (``python_frozen_vs_plain_frozen_ratio``), and ftlayer's own part
  (``ft_on_vs_python_frozen_ratio``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from runtime.bench.common import BENCH_STOP_GRACE_S, Stopwatch, as_shipped, summary
from runtime.driver.query_stop import stop_query
from runtime.sinks import CallableSink
from runtime.spark.worker_heap import freeze_worker_heap
from runtime.topology import Topology

USERS = 97
PRIME_RECORDS = 20_000  # an untimed FT-off run that warms fresh Python workers (bench_e2e)


def make_value(i: int, payload_bytes: int) -> dict[str, Any]:
    """One input record; ``payload_bytes`` > 0 pads it to about that size."""
    value: dict[str, Any] = {"i": i, "user": f"user-{i % USERS}", "page": f"/p/{i % 13}"}
    if payload_bytes:
        value["pad"] = "x" * max(0, payload_bytes - 40)
    return value


def first_map(e: dict[str, Any]) -> dict[str, Any]:
    return {**e, "n": e["i"] * 2}


def second_map(e: dict[str, Any]) -> dict[str, Any]:
    return {**e, "seen": True}


def discard(values: list[Any]) -> None:
    return None


@dataclass(frozen=True)
class Run:
    variant: str
    records: int
    seconds: float
    # the run's stop interrupted a running micro-batch (a rate source always has the next one):
    # Spark then discards the Python workers of its killed tasks (see bench_e2e)
    interrupted: bool = False
    # the machine's busy CPU seconds over the same span as ``seconds`` (None without /proc/stat)
    cpu_s: float | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def cpu_us_per_record(self) -> float | None:
        """The machine's busy CPU per record over the run, in microseconds (None without /proc/stat)."""
        return None if self.cpu_s is None else self.cpu_s * 1e6 / self.records


def run_ftlayer(spark: Any, config: FTConfig, records: int, payload_bytes: int, *, ft_on: bool) -> Run:
    """One FT-on or FT-off run: start, wait until drained, stop."""
    cfg = config.replace(status="on" if ft_on else "off", namespace="bench" + uuid.uuid4().hex[:8],
                         max_pending=config.max_pending, state_dir=TEMP_STATE_DIR)  # throw-away runs
    topo = Topology("bench", cfg)
    source = (make_value(i, payload_bytes) for i in range(records))
    (topo.source("events", source).map(first_map).key_by(lambda e: e["user"]).map(second_map)
     .sink(CallableSink(discard)))
    # each run its own checkpoint: runs share the topology name, and a ':temp:' state dir is one
    # per process, so the default checkpoint would carry one run's offsets into the next
    checkpoint = tempfile.mkdtemp(prefix="ftlayer-bench-e2e-")
    watch = Stopwatch()
    query = topo.start(spark, trigger_interval_s=0.1, checkpoint_location=checkpoint)
    try:
        if not query.await_drained(3600, poll_s=0.05):
            msg = f"bench run ({'ft-on' if ft_on else 'ft-off'}) did not drain"
            raise RuntimeError(msg)
        elapsed, cpu = watch.read()
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    return Run("ft-on" if ft_on else "ft-off", records, elapsed, cpu_s=cpu)


def run_plain(spark: Any, records: int, payload_bytes: int, *, frozen: bool = False,
              python_source: bool = False) -> Run:
    """Hand-written Structured Streaming, no ftlayer: same maps, repartition by user, noop sink
    (``frozen``: with ftlayer's worker-heap freeze, see the module docstring; ``python_source``: its
    rows from a trivial PySpark Python data source, :mod:`runtime.bench.python_source`, instead of
    ``rate-micro-batch``)."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    prepare = freeze_worker_heap if frozen else as_shipped

    pad = "x" * max(0, payload_bytes - 40) if payload_bytes else None

    def op1(batches: Any) -> Any:
        prepare()
        for rb in batches:
            out = [first_map(make_value(int(v), 0) | ({"pad": pad} if pad else {}))
                   for v in rb.column("value").to_pylist()]
            yield pa.RecordBatch.from_pylist(
                [{"i": o["i"], "user": o["user"], "page": o["page"], "n": o["n"], "pad": o.get("pad")} for o in out],
                schema=pa.schema([("i", pa.int64()), ("user", pa.string()), ("page", pa.string()),
                                  ("n", pa.int64()), ("pad", pa.string())]),
            )

    def op2(batches: Any) -> Any:
        prepare()
        for rb in batches:
            out = [second_map(row) for row in rb.to_pylist()]
            yield pa.RecordBatch.from_arrays([pa.array([len(out)], pa.int64())], names=["count"])

    per_batch = 50_000
    if python_source:
        from runtime.bench.python_source import NAME, ROWS_PER_BATCH, register

        assert per_batch == ROWS_PER_BATCH
        register(spark)
        rows = spark.readStream.format(NAME).option("records", str(records)).load().select(F.col("i").alias("value"))
    else:
        rows = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per_batch).load()
    df = (
        rows
        .mapInArrow(op1, "i long, user string, page string, n long, pad string")
        .repartition(2, "user")
        .mapInArrow(op2, "count long")
    )
    watch = Stopwatch()
    query = df.writeStream.format("noop").trigger(processingTime="100 milliseconds").start()
    try:
        done = 0
        # rate-micro-batch always has another batch: count processed rows from progress events
        while done < records:
            done = sum(int(p["numInputRows"]) for p in query.recentProgress)
            failure = query.exception()
            if failure is not None:
                raise failure
            time.sleep(0.01)
        elapsed, cpu = watch.read()
    finally:
        quiet = stop_query(query, BENCH_STOP_GRACE_S)
    name = ("python" if python_source else "plain") + ("-frozen" if frozen else "")
    return Run(name, done, elapsed, interrupted=not quiet, cpu_s=cpu)


def cpu_per_record(rounds: list[dict[str, Run]]) -> dict[str, Any]:
    """``cpu_us_per_record``: each variant's machine CPU per record over its rounds (median, min, max),
    with how it was measured; empty where ``/proc/stat`` gave none (not Linux)."""
    per: dict[str, list[float]] = {}
    for got in rounds:
        for name, run in got.items():
            if run.cpu_us_per_record is not None:
                per.setdefault(name, []).append(round(run.cpu_us_per_record, 3))
    if not per:
        return {}
    return {
        "cpu_us_per_record": {name: summary(v) for name, v in per.items()},
        "cpu_method": "the machine's busy CPU (/proc/stat: every process, every core; idle and I/O wait "
        "excluded) over the same span as the rate, / records; nothing else running",
    }


def alternate(variants: dict[str, Callable[[], Run]], repeats: int, *, prime: Callable[[], Any],
              interrupted: bool = False, on_round: Any = None) -> tuple[list[dict[str, Run]], int]:
    """Run every variant ``repeats`` times, the order rotated each round; each round's runs by
    variant (``on_round(r, runs)`` after each), and how many times ``prime`` ran: before any run that
    follows a run whose stop interrupted a micro-batch (``interrupted``: the one before the first),
    untimed (see :func:`bench_e2e`)."""
    names, rounds, primes = list(variants), [], 0
    for r in range(repeats):
        got: dict[str, Run] = {}
        for name in names[r % len(names):] + names[: r % len(names)]:
            if interrupted:
                prime()
                primes += 1
            run = variants[name]()
            interrupted = run.interrupted
            got[name] = run
        rounds.append(got)
        if on_round is not None:
            on_round(r, got)
    return rounds, primes


def bench_e2e(spark: Any, config: FTConfig, records: int, payload_bytes: int, repeats: int, *,
              on_round: Any = None, warm_up: bool = True) -> dict[str, Any]:
    """Alternate ft-on, ft-off, plain, plain-frozen and python-frozen ``repeats`` times (order rotated
    each round).

    Returns records/s per variant (median, min, max) and the per-round ratios ft-on / ft-off,
    ft-on / plain, ft-on / plain-frozen, python-frozen / plain-frozen and ft-on / python-frozen.
    A warm-up round of each variant runs first and is not counted (the first query in a session pays JVM and
    Python-worker start-up); ``warm_up=False`` skips it (tests of the bench itself).

    Every timed run starts on warm Python workers. A plain run's source always has its next
    micro-batch, so its stop interrupts one (``Run.interrupted``), and Spark discards the Python
    workers of the tasks it killed: the next run would fork fresh ones and pay their imports and
    first heap freeze inside its timing (at 1 KiB, plain on such workers ran 45k records/s against
    75k on warm ones, 2026-11-27). The rotation always put plain-frozen after plain and ft-on after
    plain-frozen, so those two paid it. After such a stop an untimed FT-off run of
    :data:`PRIME_RECORDS` records (it ends between batches) starts the new workers first; the
    count is ``primes`` in the result.
    """
    variants: dict[str, Callable[[], Run]] = {
        "ft-on": lambda: run_ftlayer(spark, config, records, payload_bytes, ft_on=True),
        "ft-off": lambda: run_ftlayer(spark, config, records, payload_bytes, ft_on=False),
        "plain": lambda: run_plain(spark, records, payload_bytes),
        "plain-frozen": lambda: run_plain(spark, records, payload_bytes, frozen=True),
        "python-frozen": lambda: run_plain(spark, records, payload_bytes, frozen=True, python_source=True),
    }
    interrupted = False  # the last run's stop killed tasks (and so their Python workers)
    if warm_up:  # not counted: JVM, Python workers, first-query costs
        warm = min(records, 50_000)
        run_ftlayer(spark, config, warm, payload_bytes, ft_on=True)
        run_ftlayer(spark, config, warm, payload_bytes, ft_on=False)
        run_plain(spark, warm, payload_bytes)
        run_plain(spark, warm, payload_bytes, frozen=True)
        interrupted = run_plain(spark, warm, payload_bytes, frozen=True, python_source=True).interrupted
    rounds, primes = alternate(
        variants, repeats, prime=lambda: run_ftlayer(spark, config, min(records, PRIME_RECORDS), payload_bytes,
                                                     ft_on=False),
        interrupted=interrupted, on_round=on_round)
    rate_rounds = [{name: run.rate for name, run in got.items()} for got in rounds]
    rates = {name: [got[name] for got in rate_rounds] for name in variants}
    on_off = [got["ft-on"] / got["ft-off"] for got in rate_rounds]
    on_plain = [got["ft-on"] / got["plain"] for got in rate_rounds]
    on_frozen = [got["ft-on"] / got["plain-frozen"] for got in rate_rounds]
    on_python = [got["ft-on"] / got["python-frozen"] for got in rate_rounds]
    python_plain = [got["python-frozen"] / got["plain-frozen"] for got in rate_rounds]
    return {
        "records": records,
        "payload_bytes": payload_bytes,
        "records_per_s": {name: summary(v) for name, v in rates.items()},
        **cpu_per_record(rounds),
        "ft_on_vs_off_ratio": summary(on_off),
        "ft_on_vs_plain_ratio": summary(on_plain),
        "ft_on_vs_plain_frozen_ratio": summary(on_frozen),
        # the reference: what a Python source costs (python-frozen against plain-frozen), and ftlayer's own part
        "python_frozen_vs_plain_frozen_ratio": summary(python_plain),
        "ft_on_vs_python_frozen_ratio": summary(on_python),
        "primes": primes,
    }

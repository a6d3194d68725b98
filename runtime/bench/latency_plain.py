"""Spark's own latency floor: the latency bench's load through hand-written Structured Streaming.

:func:`plain_latency` runs the same paced load, topology shape and trigger as
:func:`runtime.bench.latency.bench_latency`, with no ftlayer, so the two p99 figures are
measured side by side in one run (``plain_latency_p99_over_trigger`` in results.json).
"""

from __future__ import annotations

import time
import uuid
from array import array
from collections.abc import Mapping
from typing import Any

from ftlayer.store.connection import client_for
from runtime.bench.common import BENCH_STOP_GRACE_S, as_shipped
from runtime.bench.e2e import first_map, make_value, second_map
from runtime.bench.latency import LatencyBenchError, _batches, percentile
from runtime.driver.query_stop import stop_query

__all__ = ["plain_latency"]


def _paced_source_class() -> Any:
    """A plain PySpark streaming data source (no ftlayer) of rows ``(i, t)`` due at ``rate`` per second.

    Row ``i`` is due at ``t0 + i / rate`` (``t`` = that time): the latest offset is the count of rows
    due by now, and a range is regenerated on read, so it is as fresh as the FT run's paced source
    (Spark's ``rate`` source makes rows available once per second only, which would add up to a
    second of latency that no processing causes).
    """
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class _Range(InputPartition):
        def __init__(self, lo: int, hi: int) -> None:
            super().__init__(lo)
            self.lo, self.hi = lo, hi

    class _Reader(DataSourceStreamReader):
        def __init__(self, options: Mapping[str, str]) -> None:
            self.rate = float(options["rate"])
            self.t0 = float(options["t0"])

        def initialOffset(self) -> dict[str, int]:
            return {"i": 0}

        def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
            return {"i": max(0, int((time.time() - self.t0) * self.rate))}  # every row due by now

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            lo, hi = int(start["i"]), int(end["i"])
            mid = (lo + hi) // 2
            return [_Range(lo, mid), _Range(mid, hi)]

        def read(self, partition: Any) -> Any:
            as_shipped()
            for i in range(partition.lo, partition.hi):
                yield (i, self.t0 + i / self.rate)

        def commit(self, end: dict[str, int]) -> None:
            return None

    class PacedRows(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ftlayer_bench_paced"

        def schema(self) -> str:
            return "i long, t double"

        def streamReader(self, schema: Any) -> Any:
            return _Reader(self.options)

    return PacedRows


def _batch_after(progress: Any, since_wall: float) -> bool:
    """Whether a finished batch with input started at or after ``since_wall`` (epoch seconds)."""
    return int(_batches(list(progress), since_wall)["count"]) > 0


def plain_latency(
    spark: Any,
    url: str,
    *,
    rate_per_s: float = 2000,
    duration_s: float = 30.0,
    warmup_s: float = 8.0,
    trigger_interval_s: float = 1.0,
) -> dict[str, Any]:
    """The same latency for hand-written Structured Streaming, no ftlayer: Spark's own floor.

    A plain PySpark streaming source of rows due at the same rate (:func:`_paced_source_class`:
    ``t`` is when a row was due, like the FT run's stamp), the same two maps in ``mapInArrow``
    around a ``repartition`` by user, the same trigger; the second map's task records
    ``(i, due, now)`` of every row when it has processed its batch (as the FT run's sink does
    after its ack flush). Rows due in the first ``warmup_s`` seconds are not measured; then
    ``duration_s`` seconds of rows are.
    """
    import pyarrow as pa

    key = f"benchplainlat{uuid.uuid4().hex[:10]}"

    def op1(batches: Any) -> Any:
        as_shipped()
        for rb in batches:
            due = rb.column("t").to_pylist()
            out = [first_map(make_value(int(v), 0)) for v in rb.column("i").to_pylist()]
            yield pa.RecordBatch.from_pylist(
                [{"i": o["i"], "user": o["user"], "n": o["n"], "t": t} for o, t in zip(out, due, strict=True)],
                schema=pa.schema([("i", pa.int64()), ("user", pa.string()), ("n", pa.int64()), ("t", pa.float64())]),
            )

    def op2(batches: Any) -> Any:
        as_shipped()
        rows: list[float] = []
        for rb in batches:
            for row in rb.to_pylist():
                second_map(row)
                rows.extend((float(row["i"]), row["t"]))
        now = time.time()
        if rows:
            out = array("d")
            for j in range(0, len(rows), 2):
                out.extend((rows[j], rows[j + 1], now))
            client_for(url).rpush(key, out.tobytes())
        yield pa.RecordBatch.from_arrays([pa.array([len(rows) // 2], pa.int64())], names=["count"])

    spark.dataSource.register(_paced_source_class())
    df = (spark.readStream.format("ftlayer_bench_paced").option("rate", str(rate_per_s))
          .option("t0", repr(time.time())).load()
          .mapInArrow(op1, "i long, user string, n long, t double")
          .repartition(2, "user")
          .mapInArrow(op2, "count long"))
    query = df.writeStream.format("noop").trigger(processingTime=f"{int(trigger_interval_s * 1000)} milliseconds") \
        .start()
    client = client_for(url)
    started = time.time()
    try:
        # the window's rows are all processed once a batch with input has started after the window
        # and finished (it took every row due by its start): poll for that, not a fixed margin (one
        # long batch on a loaded machine can span the whole window); bounded at 60 s past the window
        window_end = started + warmup_s + duration_s
        deadline = time.monotonic() + warmup_s + duration_s + 60.0
        time.sleep(warmup_s + duration_s)  # no such batch can have finished before
        while not _batch_after(query.recentProgress, window_end) and time.monotonic() < deadline:
            if query.exception() is not None:
                break
            time.sleep(0.1)
        failure = query.exception()
        if failure is not None:
            raise failure
        progress = list(query.recentProgress)
    finally:
        stop_query(query, BENCH_STOP_GRACE_S)
        # a task that was ending when the query stopped may still report: wait until the reports stop
        seen, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < 1.0:
            n = int(client.llen(key))
            if n != seen:
                seen, quiet_since = n, time.monotonic()
            time.sleep(0.1)
    first: dict[int, tuple[float, float]] = {}
    chunks: list[bytes] = client.lrange(key, 0, -1)  # type: ignore[assignment]
    for chunk in chunks:
        vals = array("d")
        vals.frombytes(chunk)
        for j in range(0, len(vals), 3):
            i, due, done = int(vals[j]), vals[j + 1], vals[j + 2]
            if i not in first or done < first[i][1]:
                first[i] = (due, done)
    client.delete(key)
    t_from = min((d for d, _ in first.values()), default=started) + warmup_s
    picked = sorted((done - due) * 1000.0 for due, done in first.values() if t_from <= due < t_from + duration_s)
    if not picked:
        msg = "plain latency run measured no rows"
        raise LatencyBenchError(msg)
    p99 = percentile(picked, 99)
    return {
        "count": len(picked),
        "p50_ms": round(percentile(picked, 50), 2),
        "p90_ms": round(percentile(picked, 90), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(picked[-1], 2),
        "p99_over_trigger": round(p99 / (trigger_interval_s * 1000.0), 3),
        "batches": _batches(progress, t_from),
        "method": "a plain PySpark streaming source of rows due at the FT run's load -> mapInArrow -> "
                  "repartition(user) -> mapInArrow -> noop, same trigger; a row's due time to the moment its "
                  "second-stage task had processed its batch",
    }

"""Fault injectors of the chaos harness. Every fault is real: an exception, a killed process, a dropped
connection, a stalled sink.

Record faults run inside Spark tasks (Python workers) as part of a user function
(:class:`ChaosMap`) or a sink; they are picklable and coordinate through a
:class:`~runtime.testing.FaultLog` directory, so "once" means once across worker
processes, task retries and query restarts. Each records the ids it touched, which
is how the checker explains replays.

- :class:`FailAtRate`: ``FailRecord`` for a deterministic pseudo-random share of ids, once per id.
- :class:`KillWorker`: the Python worker dies mid-partition (SIGKILL or ``os._exit``) at given ids, once each.
- :class:`Poison`: ``FailRecord`` for given ids every time: dead-lettered after ``max_replays``.
- :class:`FailBatchSink`: every task of micro-batch ``batch`` dies on each of its ``attempts`` attempts,
  so Spark gives up and the query dies.
- :class:`DelayingSink`: the write holding given ids first sleeps past the timeout, once.

Driver-side faults run in threads: :class:`ConnectionDropper` (``CLIENT KILL TYPE normal`` every
``interval_s``), and :class:`Sampler` (records a counter over time, e.g. to measure the
durability window around a Redis kill).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import redis
import xxhash

from ftlayer.errors import FailRecord
from ftlayer.logs import logger_for
from runtime.sinks import ExecutorSink, SinkContext
from runtime.testing import CollectingSink, FaultLog

log = logger_for(__name__)


class BatchKill(BaseException):
    """Raised by :class:`FailBatchSink` to fail a whole task (handlers catch ``Exception`` only)."""


class RecordFault:
    """A fault applied to each value a :class:`ChaosMap` sees (may raise or kill the process)."""

    def __call__(self, value: Any) -> None:
        raise NotImplementedError


class ChaosMap:
    """A user function (``stream.map``) that applies its faults to each value and returns it unchanged."""

    def __init__(self, faults: Sequence[RecordFault], sleep_s: float = 0.0) -> None:
        self.faults = tuple(faults)
        self.sleep_s = sleep_s

    def __call__(self, value: Any) -> Any:
        for fault in self.faults:
            fault(value)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return value


def selected(i: int, rate: float, seed: int) -> bool:
    """Deterministic pseudo-random choice of ``rate`` of the ids (the same in every process)."""
    return xxhash.xxh64_intdigest(f"{seed}:{i}".encode()) % 1_000_000 < rate * 1_000_000


class FailAtRate(RecordFault):
    """``FailRecord`` for about ``rate`` of the ids, once per id (the replay then succeeds)."""

    def __init__(self, faults: FaultLog, rate: float, *, seed: int = 7, name: str = "fail-rate") -> None:
        self.log, self.rate, self.seed, self.name = faults, rate, seed, name

    def __call__(self, value: Any) -> None:
        i = int(value["i"])
        if selected(i, self.rate, self.seed) and self.log.once(self.name, f"i{i}"):
            self.log.record(self.name, [i])
            msg = f"chaos {self.name}: id {i}"
            raise FailRecord(msg)


class Poison(RecordFault):
    """``FailRecord`` for the given ids every time they are processed (they end in the dead letters)."""

    def __init__(self, faults: FaultLog, ids: Iterable[int], *, name: str = "poison") -> None:
        self.log, self.ids, self.name = faults, frozenset(ids), name

    def __call__(self, value: Any) -> None:
        i = int(value["i"])
        if i in self.ids:
            if self.log.once(self.name, f"i{i}"):
                self.log.record(self.name, [i])
            msg = f"chaos {self.name}: id {i} always fails"
            raise FailRecord(msg)


class KillWorker(RecordFault):
    """The Python worker dies when it processes one of ``at_ids`` (once per id), mid-partition,
    before its task flushed anything. ``how``: ``"sigkill"`` or ``"exit"`` (``os._exit(3)``).

    The ids this task attempt saw before dying are recorded: they are the ones a retry
    processes again.
    """

    def __init__(self, faults: FaultLog, at_ids: Iterable[int], *, how: str = "sigkill",
                 name: str = "kill-worker") -> None:
        self.log, self.at_ids, self.how, self.name = faults, frozenset(at_ids), how, name
        self._task: int | None = None
        self._seen: list[int] = []

    def __call__(self, value: Any) -> None:
        from pyspark import TaskContext

        tc = TaskContext.get()
        task = tc.taskAttemptId() if tc is not None else None
        if task != self._task:
            self._task, self._seen = task, []
        i = int(value["i"])
        self._seen.append(i)
        if i in self.at_ids and self.log.once(self.name, f"i{i}"):
            self.log.record(self.name, self._seen)
            if self.how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)


class FailBatchSink(CollectingSink):
    """A collecting sink whose every task of micro-batch ``batch`` dies, ``attempts`` times per
    partition (Spark's ``local[2,4]`` gives a task 4 attempts, so the job fails and the query dies).
    A restarted query re-runs the batch; the marks are taken, so it succeeds then."""

    def __init__(self, directory: str | Path, faults: FaultLog, *, batch: int = 2,
                 attempts: int = 4, name: str = "batch-fails", inner: ExecutorSink | None = None) -> None:
        super().__init__(directory)
        self.log, self.batch, self.attempts, self.name = faults, batch, attempts, name
        self.inner = inner  # where the rows go (an effectively-once target), else the lines

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        if ctx.batch_id == str(self.batch) and ctx.attempt < self.attempts and self.log.once(
            self.name, f"b{ctx.batch_id}-p{ctx.partition}-a{ctx.attempt}"
        ):
            self.log.record(self.name, [int(v["i"]) for v in values])
            msg = f"chaos {self.name}: batch {ctx.batch_id} partition {ctx.partition} attempt {ctx.attempt}"
            raise BatchKill(msg)
        if self.inner is not None:
            self.inner.write(values, ctx)
        else:
            super().write(values, ctx)


class DelayingSink(CollectingSink):
    """A collecting sink that, the first time a write holds one of ``ids``, sleeps ``sleep_s``
    (past the timeout) before writing and acking. Every id of that write is recorded."""

    def __init__(self, directory: str | Path, faults: FaultLog, ids: Iterable[int],
                 sleep_s: float, *, name: str = "delayed-acks", inner: ExecutorSink | None = None) -> None:
        super().__init__(directory)
        self.log, self.ids, self.sleep_s, self.name = faults, frozenset(ids), sleep_s, name
        self.inner = inner  # where the rows go (an effectively-once target), else the lines

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        got = [int(v["i"]) for v in values]
        fresh = [i for i in got if i in self.ids and self.log.once(self.name, f"i{i}")]
        if fresh:
            self.log.record(self.name, got)
            time.sleep(self.sleep_s)
        if self.inner is not None:
            self.inner.write(values, ctx)
        else:
            super().write(values, ctx)


_T = TypeVar("_T", bound="_DriverThread")


class _DriverThread:
    """A daemon thread on the driver running ``_run`` until :meth:`stop`."""

    thread_name = "chaos"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        raise NotImplementedError

    def start(self: _T) -> _T:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


class ConnectionDropper(_DriverThread):
    """Driver thread: ``CLIENT KILL TYPE normal SKIPME yes`` every ``interval_s`` (every client of
    the server but its own: ingest, FT service, source runner, Python workers)."""

    thread_name = "chaos-drop-connections"

    def __init__(self, url: str, interval_s: float = 0.2) -> None:
        super().__init__()
        self.url = url
        self.interval_s = interval_s
        self.rounds = 0
        self.killed = 0
        self.errors = 0

    def _run(self) -> None:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=2)
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    self.killed += int(client.client_kill_filter(_type="normal", skipme=True))
                    self.rounds += 1
                except redis.RedisError:
                    self.errors += 1
        finally:
            client.close()


class Sampler(_DriverThread):
    """Driver thread: every ``interval_s`` records ``(monotonic time, fn())``; errors are skipped."""

    thread_name = "chaos-sampler"

    def __init__(self, fn: Callable[[], int], interval_s: float = 0.05) -> None:
        super().__init__()
        self.fn = fn
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.fn()))
            except Exception:  # a failed sample is only a gap in the series
                log.debug("sampler: sample failed", exc_info=True)
            self._stop.wait(self.interval_s)

    def at(self, t: float) -> int:
        """The last value sampled at or before ``t`` (0 before the first sample)."""
        value = 0
        for ts, v in self.samples:
            if ts > t:
                break
            value = v
        return value

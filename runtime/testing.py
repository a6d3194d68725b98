"""Helpers for writing your own fault-injection scenarios in a few lines.

::

    source = ScriptedSource([Emit(1000), Pause(0.5), Emit(1000), EOF])
    sink = CollectingSink(tmp / "out")
    faults = FaultLog(tmp / "faults")
    topo = Topology("mine", config)
    topo.source("events", source).map(my_fn).sink(sink)
    query = topo.start(spark)
    query.await_drained(120); query.stop()
    report = check(query, sink, source.emitted_ids, faults)   # runtime.checker
    assert report.ok, report.summary()

- :class:`ScriptedSource` is an open/poll/close source (see :mod:`runtime.driver.ingest`)
  driven by a script of sentinels: :class:`Emit`, :class:`Pause`, :class:`Abort`
  and :data:`EOF`. Every value it emits is a dict carrying a unique integer
  ``"i"`` (0, 1, 2, ... in emission order), so a checker can account for each.
- :class:`CollectingSink` is a :class:`~runtime.sinks.JsonLinesSink` with meta:
  every delivered value becomes a line ``{"origin", "replay", "partition",
  "value"}``; :meth:`CollectingSink.read` returns them.
- :class:`FaultLog` is a directory shared by every process of a scenario (driver,
  Python workers, a restarted driver): injectors call :meth:`FaultLog.once` to
  act exactly once across processes and retries, and :meth:`FaultLog.record` to
  say which record ids a fault touched, which is how the checker tells an
  expected replay from an unexplained one.
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.sinks import JsonLinesSink

__all__ = ["EOF", "Abort", "CollectingSink", "Emit", "FaultLog", "Pause", "ScriptedSource", "default_value", "once"]


@dataclass(frozen=True)
class Emit:
    """Emit ``values`` (a sequence; dicts get an ``"i"``, other values are wrapped as
    ``{"i": i, "value": v}``) or, given an int, that many generated values
    ``{"i": i, "user": "u<i % 37>"}``."""

    values: Sequence[Any] | int


@dataclass(frozen=True)
class Pause:
    """Emit nothing for ``seconds``; with ``until``, stop pausing as soon as ``until()``
    is true (``seconds`` is then the most it waits)."""

    seconds: float
    until: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Abort:
    """``poll`` raises ``exception``: ingest stops; the records read so far are persisted."""

    exception: Exception


class _EOFType:
    """``poll`` returns None: the source has ended (it stays ended)."""

    _instance: _EOFType | None = None

    def __new__(cls) -> _EOFType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "EOF"


EOF = _EOFType()
Step = Emit | Pause | Abort | _EOFType


def default_value(i: int) -> dict[str, Any]:
    """The value ``Emit(n)`` generates for id ``i``."""
    return {"i": i, "user": f"u{i % 37}"}


class ScriptedSource:
    """An open/poll/close source that plays a script of :class:`Emit`, :class:`Pause`,
    :class:`Abort` and :data:`EOF` steps (the end of the script is an EOF too).

    Contract:

    - Ids are assigned in emission order, starting at ``first_id``; a value is
      counted as emitted when it is handed to the caller (``poll`` returns a lazy
      iterable of at most ``chunk`` values), so :attr:`emitted_ids` is exactly what
      the ingest thread received, even if it stopped half-way through a poll.
    - The position survives ``close()``/``open()``: giving the same object to a
      restarted topology continues where the first one stopped (an ended source
      stays ended), which is what a source that cannot rewind looks like.
    - ``poll`` is meant for one ingest thread at a time; the counters may be read
      from any thread.
    """

    def __init__(
        self,
        script: Iterable[Step],
        *,
        chunk: int = 500,
        first_id: int = 0,
        make_value: Callable[[int], Any] = default_value,
    ) -> None:
        self.steps: list[Step] = list(script)
        self.chunk = chunk
        self.first_id = first_id
        self.make_value = make_value
        self.opened = 0
        self.closed = 0
        self._pos = 0  # index of the current step
        self._offset = 0  # values of the current Emit already emitted
        self._pause_until: float | None = None
        self._next_id = first_id
        self._lock = threading.Lock()
        self._chunk_times: list[float] = []  # monotonic time each emitted chunk started
        self._chunk_firsts: list[int] = []  # first id of each chunk

    # --- the source protocol ---------------------------------------------------------
    def open(self) -> None:
        self.opened += 1

    def close(self) -> None:
        self.closed += 1

    def poll(self) -> Iterable[Any] | None:
        """The next values (possibly none), or None once the script has ended."""
        while self._pos < len(self.steps):
            step = self.steps[self._pos]
            if isinstance(step, Emit):
                total = step.values if isinstance(step.values, int) else len(step.values)
                if self._offset >= total:
                    self._advance()
                    continue
                return self._emit(step, min(self.chunk, total - self._offset))
            if isinstance(step, Pause):
                now = time.monotonic()
                if self._pause_until is None:
                    self._pause_until = now + step.seconds
                if now >= self._pause_until or (step.until is not None and step.until()):
                    self._advance()
                    continue
                return []
            if isinstance(step, Abort):
                self._advance()
                raise step.exception
            return None  # EOF
        return None

    def _advance(self) -> None:
        self._pos += 1
        self._offset = 0
        self._pause_until = None

    def _emit(self, step: Emit, n: int) -> Iterator[Any]:
        with self._lock:
            self._chunk_times.append(time.monotonic())
            self._chunk_firsts.append(self._next_id)
        for _ in range(n):
            with self._lock:
                i = self._next_id
                value = self._value(step, i, self._offset)
                self._next_id += 1
                self._offset += 1
            yield value  # counted before it is handed over: the caller has it

    def _value(self, step: Emit, i: int, k: int) -> Any:
        if isinstance(step.values, int):
            return self.make_value(i)
        v = step.values[k]
        return {**v, "i": i} if isinstance(v, dict) else {"i": i, "value": v}

    # --- what was emitted -----------------------------------------------------------
    @property
    def emitted(self) -> int:
        """How many values were handed to the caller."""
        with self._lock:
            return self._next_id - self.first_id

    @property
    def emitted_ids(self) -> range:
        """The ids of every value handed to the caller."""
        with self._lock:
            return range(self.first_id, self._next_id)

    @property
    def ended(self) -> bool:
        """True once the script reached EOF (or its end)."""
        return self._pos >= len(self.steps) or self.steps[self._pos] is EOF

    def emitted_at(self, i: int) -> float | None:
        """Monotonic time at which the poll that emitted id ``i`` started (None if not emitted)."""
        with self._lock:
            if not self.first_id <= i < self._next_id:
                return None
            k = bisect.bisect_right(self._chunk_firsts, i) - 1
            return self._chunk_times[k]


class CollectingSink(JsonLinesSink):
    """A JSON-lines sink with meta (``origin``, ``replay``, ``partition``, ``value``) that
    a scenario reads back with :meth:`read`. Picklable; writes are atomic per file."""

    def __init__(self, directory: str | Path) -> None:
        super().__init__(directory, with_meta=True)

    def iter_lines(self) -> Iterator[dict[str, Any]]:
        """Every delivered line, file by file (memory-light for big runs)."""
        for path in sorted(Path(self.directory).glob("part-*.jsonl")):
            with path.open(encoding="utf-8") as fh:
                for line in fh:
                    yield json.loads(line)

    def read(self) -> list[dict[str, Any]]:
        """Every delivered line so far."""
        return list(self.iter_lines())



def once(marker_dir: str | Path, name: str) -> bool:
    """True the first time ``name`` is asked for in ``marker_dir``, in any process (an O_EXCL file)."""
    Path(marker_dir).mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(Path(marker_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True

class FaultLog:
    """A directory shared by all processes of a scenario, where fault injectors leave marks.

    Layout: ``<dir>/<fault>/marks/<key>`` (one empty file per :meth:`once` key) and
    ``<dir>/<fault>/ids`` (one record id per line, appended by :meth:`record`).
    Picklable (only the path travels). Fault names and keys must be file names.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = str(directory)

    def _dir(self, fault: str) -> Path:
        path = Path(self.directory, fault)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def once(self, fault: str, key: str) -> bool:
        """True for the first caller with this (fault, key) in any process, False afterwards."""
        return once(self._dir(fault) / "marks", key)

    def marks(self, fault: str) -> int:
        """How many :meth:`once` keys of ``fault`` were taken."""
        path = Path(self.directory, fault, "marks")
        return len(list(path.iterdir())) if path.is_dir() else 0

    def record(self, fault: str, ids: Iterable[int]) -> None:
        """Note that ``fault`` touched these record ids (one appending write; safe across processes)."""
        data = "".join(f"{int(i)}\n" for i in ids)
        if not data:
            return
        fd = os.open(self._dir(fault) / "ids", os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
        try:
            os.write(fd, data.encode())
        finally:
            os.close(fd)

    def faults(self) -> list[str]:
        """Names of the faults that left any mark or id."""
        root = Path(self.directory)
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []

    def affected(self) -> dict[str, set[int]]:
        """Record ids per fault (faults with marks but no ids map to an empty set)."""
        out: dict[str, set[int]] = {}
        for fault in self.faults():
            path = Path(self.directory, fault, "ids")
            text = path.read_text() if path.exists() else ""
            out[fault] = {int(x) for x in text.split()}
        return out

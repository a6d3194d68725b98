"""Acks of the DataFrame path settled on a driver thread, overlapping the next micro-batch.

``foreachBatch(acking(fn))`` returns to Spark as soon as ``fn`` returned; the batch's ack
(:func:`runtime.dataframe.acking.settle_batch`, one bounded Lua loop over the batch's ids)
runs on one :class:`BackgroundSettler` thread per process while Spark commits the batch and
plans the next one. Contract:

- **Order and bound.** Batches are settled in the order they were submitted, one at a time.
  At most ``max_waiting`` wait; a further :meth:`submit` blocks until one is done
  (backpressure: acks never fall more than a few batches behind).
- **Never before the write.** A batch is submitted only after ``fn`` returned, so the rule
  "acked only after every row was written" is unchanged. The ack now usually lands *after*
  Spark wrote the batch's commit log, which narrows the window in docs/guarantees.md.
- **Loss of the thread.** If the driver process dies with batches still waiting, their records
  were written but not acked: they time out and are replayed (duplicates, never a loss). A
  Redis error is logged and has the same outcome.
- :meth:`flush` waits until everything submitted so far is settled (tests, a clean stop).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Job = Callable[[], None]


class BackgroundSettler:
    """One daemon thread running settle jobs in FIFO order (see the module contract)."""

    def __init__(self, max_waiting: int = 4) -> None:
        self._jobs: queue.Queue[Job] = queue.Queue(maxsize=max_waiting)
        self._thread = threading.Thread(target=self._run, name="ftlayer-settler", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def flush(self, timeout_s: float = 60.0) -> bool:
        """True once every job submitted so far has run (False after ``timeout_s``)."""
        done = threading.Event()
        try:
            self._jobs.put(done.set, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception:  # a job logs its own errors; nothing may stop the thread
                log.exception("ftlayer settler: a settle job failed; its records will time out and replay")
            finally:
                self._jobs.task_done()


_lock = threading.Lock()
_settler: list[BackgroundSettler] = []


def settler() -> BackgroundSettler:
    """The process's settler (started on first use)."""
    with _lock:
        if not _settler:
            _settler.append(BackgroundSettler())
        return _settler[0]


def flush(timeout_s: float = 60.0) -> bool:
    """Wait for every settle submitted in this process so far (True if none was waiting)."""
    with _lock:
        current = _settler[0] if _settler else None
    return True if current is None else current.flush(timeout_s)

"""Keep PySpark's per-task garbage collection cheap in the Python workers ftlayer runs in.

A reused PySpark worker (``spark.python.worker.reuse``, the default) calls
``gc.collect()`` after **every** task (``pyspark/daemon.py``). A full collection
walks every container object the process holds, and a worker that has imported
pyarrow, pandas, numpy, redis-py and ftlayer holds about 90,000 of them: each
collection then costs 20 to 60 ms of CPU on the machines measured here, paid
per task, for objects that live as long as the worker does. A micro-batch
query runs a few tasks per trigger, so on a 0.1 s trigger that is a sizeable
share of the workers' CPU (``scripts/bench e2e``: ``worker_gc_ms`` in the
results).

:func:`freeze_worker_heap` is called at the start of each ftlayer task
function (stages, sink stages, the FT and feed sources, the DataFrame path's
writers). The first call in a worker process collects once, then moves every
object still alive into the permanent generation (``gc.freeze()``), which
later collections skip. Contract:

- It freezes in the first task of a process (a forked child of a frozen
  worker has another ``pid``) and again whenever modules were imported since
  the last freeze (``sys.modules`` grew: PySpark and the libraries import
  lazily during the first tasks, and modules are the bulk of the heap), or
  after :func:`thaw_worker_heap` (the e2e benchmark's plain-Spark baseline
  thaws to measure PySpark as shipped); otherwise it does nothing, in O(1):
  two integer comparisons. It does not ask the collector whether the heap is
  still frozen: ``gc.get_freeze_count()`` walks every frozen object (some
  100,000 in a worker: 3 ms a call on an idle machine, about 20 ms in a busy
  worker, which was 30 % of a DataFrame read task's samples), so a
  ``gc.unfreeze()`` by other code goes unnoticed until the next import (the
  per-task collections are then as costly as without ftlayer, nothing worse).
  A no-op when ``config.freeze_worker_heap`` is false.
- Nothing is leaked that a collection would have freed at the time: the
  collection runs first, so only live objects are frozen. Frozen objects are
  still freed by reference counting when their last reference goes; only a
  reference *cycle* among objects alive at a freeze (that task's own objects)
  is never collected: a bounded amount, as freezes stop once imports do.
- Objects created later (every record, every batch) are collected as usual.
"""

from __future__ import annotations

import gc
import os
import sys

__all__ = ["freeze_worker_heap", "frozen_in_process", "thaw_worker_heap"]

_frozen_pid: int | None = None
_frozen_modules = 0  # len(sys.modules) at the last freeze; _THAWED after thaw_worker_heap
_THAWED = -1
freezes = 0  # freezes in this process (tests)


def freeze_worker_heap(enabled: bool = True) -> None:
    """Collect, then freeze this worker's heap, if it is new or imported modules since (module docstring)."""
    global _frozen_pid, _frozen_modules, freezes
    if not enabled:
        return
    pid, modules = os.getpid(), len(sys.modules)
    if _frozen_pid == pid and modules <= _frozen_modules:
        return
    if _frozen_pid != pid:
        freezes = 0
    gc.collect()
    gc.freeze()
    _frozen_pid, _frozen_modules = pid, modules
    freezes += 1


def thaw_worker_heap() -> None:
    """Undo the freeze (``gc.unfreeze()``): PySpark's per-task collections walk the whole heap again, as
    in a worker ftlayer never ran in; the next :func:`freeze_worker_heap` freezes anew."""
    global _frozen_modules
    gc.unfreeze()
    _frozen_modules = _THAWED


def frozen_in_process() -> bool:
    """True if this process has frozen its heap and not thawed it since (tests)."""
    return _frozen_pid == os.getpid() and _frozen_modules != _THAWED

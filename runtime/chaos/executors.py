"""Executor-JVM chaos: kill -9 one of a Spark application's executor JVMs in the middle of a run.

This needs a master with executor JVMs of their own on this machine:
``local-cluster[N,C,M]`` (a standalone master and N workers inside the driver's JVM, each
launching an executor JVM) or a standalone cluster whose workers run here. In ``local[N]``
the executors live inside the driver's JVM, so there is nothing to kill without killing
the driver; :func:`kill_executor` refuses such a master with a :class:`ChaosError`.

What the kill takes away: the tasks running on that JVM (with their Python workers, which
exit when their JVM's socket closes), the shuffle files it wrote, and its cached blocks.
Spark reschedules the lost tasks on the other executor, recomputes lost shuffle output from
the earlier stage, and the standalone worker launches a replacement executor. ftlayer's part
is that nothing persisted is lost on the way: a re-run read task reads what is still
pending, a flush the dead JVM never sent is simply missing (its records stay pending and are
read again or time out), and a flush it did send is not applied twice (flush tokens).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.chaos.base import ScenarioContext
from runtime.chaos.errors import ChaosError
from runtime.chaos.faults import RecordFault, _DriverThread
from runtime.checker import Report
from runtime.testing import FaultLog

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def executor_pids(app_id: str) -> list[int]:
    """PIDs of this machine's executor JVMs of Spark application ``app_id`` (from /proc)."""
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # the process ended while we looked
            continue
        words = [a.decode(errors="replace") for a in argv]
        if EXECUTOR_MAIN in words and app_id in words:
            pids.append(int(entry.name))
    return sorted(pids)


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` is no longer a live process (gone, or a zombie its parent has not reaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def has_executor_jvms(spark: Any) -> bool:
    """True if the session's master gives executors JVMs of their own (not ``local[...]``)."""
    master = str(spark.sparkContext.master)
    return not (master == "local" or master.startswith("local["))


def executor_jvm_of(pid: int) -> int | None:
    """The executor JVM among ``pid``'s ancestors (a Python worker's daemon's parent), or None."""
    seen = 0
    while pid > 1 and seen < 16:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        if EXECUTOR_MAIN.encode() in argv:
            return pid
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent's pid
        seen += 1
    return None


class StallUntilKilled(RecordFault):
    """A record fault: the task that processes ``at_id`` (once) writes its executor JVM's PID to
    ``<fault log>/<name>/jvm`` and waits, for at most ``stall_s``, for that JVM to die, so an
    :class:`ExecutorKiller` with :meth:`victim` kills the JVM while it runs a task of the batch.
    Once the JVM is gone the Python worker exits (its JVM's socket is closed anyway). The ids the
    task saw are recorded: a retry on another executor processes them again."""

    def __init__(self, faults: FaultLog, at_id: int, *, stall_s: float = 60.0, name: str = "stall-task") -> None:
        self.log, self.at_id, self.stall_s, self.name = faults, at_id, stall_s, name
        self._task: int | None = None
        self._seen: list[int] = []

    @property
    def jvm_file(self) -> Path:
        return Path(self.log.directory, self.name, "jvm")

    def victim(self, pids: list[int]) -> int | None:
        """For :class:`ExecutorKiller`: the stalled task's JVM once it stalls (None before)."""
        try:
            jvm = int(self.jvm_file.read_text())
        except (OSError, ValueError):
            return None
        return jvm if jvm in pids else None

    def __call__(self, value: Any) -> None:
        from pyspark import TaskContext

        tc = TaskContext.get()
        task = tc.taskAttemptId() if tc is not None else None
        if task != self._task:
            self._task, self._seen = task, []
        i = int(value["i"])
        self._seen.append(i)
        if i != self.at_id or not self.log.once(self.name, f"i{i}"):
            return
        jvm = executor_jvm_of(os.getpid())
        self.log.record(self.name, self._seen)
        if jvm is None:  # no executor JVM of our own (local[N]): nothing to wait for
            return
        tmp = self.jvm_file.with_suffix(".tmp")
        tmp.write_text(str(jvm))
        tmp.rename(self.jvm_file)
        if _wait_gone(jvm, self.stall_s):
            os._exit(0)


class ExecutorKiller(_DriverThread):
    """Driver thread: once ``progress()`` reaches ``threshold``, SIGKILL one executor JVM of ``app_id``
    (once): the one ``pick(pids)`` names (it may return None: not yet), else the last. ``killed`` is
    the PID it killed (None until then), ``progress_at_kill`` the progress it saw just before the
    kill, ``error`` why it could not kill."""

    thread_name = "chaos-kill-executor"

    def __init__(self, app_id: str, progress: Callable[[], int], threshold: int, poll_s: float = 0.1, *,
                 pick: Callable[[list[int]], int | None] | None = None) -> None:
        super().__init__()
        self.app_id = app_id
        self.progress = progress
        self.threshold = threshold
        self.poll_s = poll_s
        self.pick = pick
        self.killed: int | None = None
        self.progress_at_kill = -1
        self.gone = False  # the killed JVM left the process table (its worker reaped it)
        self.error: str | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                seen = self.progress()
            except Exception:  # a failed probe (e.g. Redis busy): try again next tick
                continue
            if seen < self.threshold:
                continue
            pids = executor_pids(self.app_id)
            if not pids:
                self.error = f"no executor JVM of application {self.app_id} found in /proc"
                return
            victim = pids[-1] if self.pick is None else self.pick(pids)
            if victim is None:
                continue
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:  # it ended on its own: look again next tick
                continue
            self.killed, self.progress_at_kill = victim, seen
            self.gone = _wait_gone(victim, 30.0)
            return


def check_kill_executor(ctx: ScenarioContext, at_fraction: float) -> None:
    """Refuse a kill-executor run (either pipeline) on a master without executor JVMs or with
    ``at_fraction`` outside (0, 1), naming what to change (ChaosError)."""
    if not has_executor_jvms(ctx.spark):
        msg = (f"chaos {ctx.name}: master {ctx.spark.sparkContext.master!r} runs executors inside the "
               "driver's JVM; use a master with executor JVMs, e.g. --master 'local-cluster[2,1,1024]'")
        raise ChaosError(msg)
    if not 0.0 < at_fraction < 1.0:
        msg = f"chaos {ctx.name}: at_fraction must be in (0, 1), got {at_fraction}"
        raise ChaosError(msg)


def kill_executor(ctx: ScenarioContext, records: int, at_fraction: float = 0.3) -> Report:
    """kill -9 one executor JVM once ``at_fraction`` of the records are acked; nothing is lost."""
    from runtime.chaos.scenarios import _run, paced
    from runtime.testing import ScriptedSource

    check_kill_executor(ctx, at_fraction)
    ctx.config = ctx.config.replace(timeout_s=30.0)
    layer = ctx.layer()
    threshold = max(1, int(records * at_fraction))
    app_id = str(ctx.spark.sparkContext.applicationId)
    killer = ExecutorKiller(app_id, lambda: int(layer.stats()["acked"]), threshold)
    source = ScriptedSource(paced(records, 250, 0.2, warm=layer))
    started = time.monotonic()
    killer.start()
    try:
        report, restarts = _run(ctx, source, [], keyed=True)
    finally:
        killer.stop()
    if killer.killed is not None:
        ctx.say(f"killed executor JVM {killer.killed} at >= {threshold} acked")
        report.notes.append(f"executor JVM {killer.killed} SIGKILLed once {threshold} records were acked; "
                            f"query restarts {restarts}; {time.monotonic() - started:.0f} s")
    report.expect(f"an executor JVM was killed mid-run and died ({killer.error or 'ok'})",
                  killer.killed is not None and killer.gone)
    report.expect(f"the kill came mid-run ({killer.progress_at_kill} of {records} acked)",
                  0 <= killer.progress_at_kill < records)
    return report

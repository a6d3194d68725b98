"""Child processes that die with this one: a SIGTERM to the child when its parent process dies (Linux).

Contract: :func:`popen_with_parent` is ``subprocess.Popen`` of a child that gets
``PR_SET_PDEATHSIG`` = SIGTERM, forked from one process-long thread (:class:`_Spawner`), so the
signal follows the life of this process, not of the thread that asked. Elsewhere than Linux the
``prctl`` call fails quietly and the child is an ordinary one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
from typing import Any

__all__ = ["popen_with_parent"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Spawner:
    """Forks child processes from one long-lived daemon thread.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits,
    not the process: a server started (or restarted) from a short-lived
    thread, such as a fault injector's, would be killed when that thread
    ended. Forking from this thread, which lives as long as the process, ties
    the signal to the process's life. Fork-safe: a child process starts its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[list[str], dict[str, Any], dict[str, Any], threading.Event]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._pid = -1

    def popen(self, args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._run, args=(self._jobs,), name="ftlayer-spawner",
                                                daemon=True)
                self._thread.start()
                self._pid = os.getpid()
            jobs = self._jobs
        box: dict[str, Any] = {}
        done = threading.Event()
        jobs.put((args, kw, box, done))
        done.wait()
        if "error" in box:
            raise box["error"]
        proc: subprocess.Popen[bytes] = box["proc"]
        return proc

    @staticmethod
    def _run(jobs: queue.SimpleQueue[tuple[list[str], dict[str, Any], dict[str, Any], threading.Event]]) -> None:
        while True:
            args, kw, box, done = jobs.get()
            try:
                box["proc"] = subprocess.Popen(args, **kw)
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc
            finally:
                done.set()


_SPAWNER = _Spawner()


def popen_with_parent(args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **kw)`` of a child that gets SIGTERM when this process dies (Linux;
    forked from the process-long spawner thread, see :class:`_Spawner`)."""
    return _SPAWNER.popen(args, preexec_fn=_die_with_parent, **kw)

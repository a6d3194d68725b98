"""The webhook receiver's ``ready_check`` (a Redis PING, say), run for ``GET /readyz`` one at a time.

Contract of :meth:`ReadyProbe.check`: it returns None when the check returned within
:data:`READY_TIMEOUT_S`, else why not, in words a ``/readyz`` answer can carry. A check that hangs
(Redis frozen) is left to finish in its own daemon thread, and until it does every later call
answers at once that it has not answered for so long: a hung check never piles up threads, and a
probe never waits more than :data:`READY_TIMEOUT_S`. Thread-safe; the check runs off the caller's
thread, so the caller may be an event loop's executor or the webhook link's answering thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

READY_TIMEOUT_S = 2.0  # a ready_check that takes longer counts as failed


class ReadyProbe:
    """Single-flight runs of one ``check`` callable (see the module contract)."""

    def __init__(self, check: Callable[[], object] | None, timeout_s: float = READY_TIMEOUT_S) -> None:
        self._check = check
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._since: float | None = None  # a check in flight since (monotonic)

    @property
    def configured(self) -> bool:
        return self._check is not None

    def check(self) -> str | None:
        if self._check is None:
            return None
        with self._lock:
            if self._since is not None:  # a check still hangs (Redis frozen?): not ready meanwhile
                return f"the ready check has not answered for {time.monotonic() - self._since:.1f} s"
            self._since = time.monotonic()
        outcome: list[BaseException | None] = []
        runner = threading.Thread(target=self._run, args=(outcome,), name="ftlayer-ready-check", daemon=True)
        runner.start()
        runner.join(self.timeout_s)
        if not outcome:  # still running: _run clears _since once it returns
            return f"the ready check did not answer within {self.timeout_s:g} s"
        error = outcome[0]
        if error is not None:
            return f"the ready check failed: {type(error).__name__}: {error}"
        return None

    def _run(self, outcome: list[BaseException | None]) -> None:
        try:
            self._check()  # type: ignore[misc]  # not None: check() returned early otherwise
        except Exception as exc:
            outcome.append(exc)
        else:
            outcome.append(None)
        finally:
            with self._lock:
                self._since = None

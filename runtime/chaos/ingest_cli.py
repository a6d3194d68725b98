"""What the receiver chaos scenarios share: ``ftlayer ingest`` child processes and the query that drains them.

- :class:`IngestProcess`: ``python -m runtime.cli.main ingest TOPOLOGY SOURCE ...`` with its output
  collected line by line as it comes (:meth:`wait_for` a line, :meth:`kill9`, :meth:`stop` with
  SIGTERM). The MQTT and webhook CLI tests use it too.
- :class:`Consumer`: a DataFrame query in the scenario's SparkSession
  (``ftlayer.read_stream`` -> ``foreachBatch(ftlayer.acking(...))``) that reads the chaos source
  while ingest processes write it, collecting the rows as checker lines; :meth:`drain` waits until
  every confirmed id arrived and nothing is pending. The checker then counts loss against what the
  producer had confirmed (a PUBACK, a 2xx), not against what ingest reported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from runtime.chaos.base import SOURCE, TOPOLOGY, ScenarioContext
from runtime.chaos.errors import ChaosError

CHANNELS = 2


class IngestProcess:
    """``ftlayer ingest *args`` in a child process (see the module notes)."""

    def __init__(self, *args: str, redis_url: str, namespace: str, env: dict[str, str] | None = None,
                 channels: int = CHANNELS, new_session: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli.main", "ingest", *args, "--redis-url", redis_url,
             "--namespace", namespace, "--num-channels", str(channels)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
            start_new_session=new_session,  # a process group of its own, for stop(group=True)
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout_s: float = 60.0) -> str:
        """The first line containing ``text``, once printed; ChaosError if the process ends first or on the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = next((line for line in self.lines if text in line), None)
            if found is not None:
                return found
            if self.proc.poll() is not None:
                self._reader.join(5)
                found = next((line for line in self.lines if text in line), None)
                if found is not None:
                    return found
                msg = f"ingest exited {self.proc.returncode} before printing {text!r}:\n{self.output}"
                raise ChaosError(msg)
            if time.monotonic() > deadline:
                msg = f"timed out waiting for ingest to print {text!r} ({timeout_s:g} s):\n{self.output}"
                raise ChaosError(msg)
            time.sleep(0.02)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(5)

    def stop(self, timeout_s: float = 60.0, *, group: bool = False) -> tuple[int, str]:
        """SIGTERM (``group``: to its whole process group, as systemd or ``docker stop`` may; needs
        ``new_session``), then wait for the exit; (exit status, output)."""
        if self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self._reader.join(5)
        return self.proc.returncode, self.output

    def run(self, timeout_s: float = 60.0) -> tuple[int, str]:
        """Wait for the process to end by itself; (exit status, output)."""
        self.proc.wait(timeout_s)
        self._reader.join(5)
        return self.proc.returncode, self.output


class Consumer:
    """The chaos source read by a DataFrame query in ``ctx.spark`` (see the module notes)."""

    def __init__(self, ctx: ScenarioContext, schema: str = "i long, user string") -> None:
        import ftlayer
        from runtime.dataframe import sources

        self.ctx = ctx
        cfg = ctx.config
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopped = False
        self.handle = sources.source(TOPOLOGY, SOURCE, config=cfg, num_channels=CHANNELS)
        df = ftlayer.read_stream(ctx.spark, TOPOLOGY, SOURCE, schema=schema, config=cfg, num_channels=CHANNELS)

        def write(batch: Any, _batch_id: int) -> None:
            rows = batch.select("i", "_ftlayer.replay").collect()
            with self._lock:
                self.lines.extend({"value": {"i": r["i"]}, "replay": r["replay"] > 0} for r in rows)

        self.query = (df.writeStream.foreachBatch(ftlayer.acking(write, config=cfg))
                      .option("checkpointLocation", str(ctx.checkpoint))
                      .trigger(processingTime="500 milliseconds").start())

    def ids(self) -> set[int]:
        with self._lock:
            return {int(line["value"]["i"]) for line in self.lines}

    def drain(self, confirmed: Iterable[int], timeout_s: float = 300.0) -> None:
        """Until every id in ``confirmed`` reached the sink and nothing is pending; ChaosError on a timeout
        or a dead query (the report would then show the loss)."""
        want = set(confirmed)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.query.exception() is not None:
                msg = f"chaos {self.ctx.name}: the query died: {self.query.exception()}"
                raise ChaosError(msg)
            if want <= self.ids() and self.handle.layer.pending_count() == 0:
                return
            time.sleep(0.5)
        self.ctx.notes.append(f"not drained within {timeout_s:.0f} s: {self.handle.stats()}, "
                              f"{len(want - self.ids())} confirmed ids not in the sink yet")

    def stop(self) -> None:
        """Stop the query (it trims what it finished: run the checker after this); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.query.stop()
        self.handle.stop()

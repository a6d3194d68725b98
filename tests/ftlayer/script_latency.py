"""Test helpers that watch how long the server is held: a PING prober and the slow log of scripts.

``PingProbe`` runs in a separate process (no GIL shared with the test, which
drives the scripts), PINGs the server over its own connection every few ms and
reports every round-trip time. ``ScriptTimes`` reads the server's SLOWLOG and
names each EVALSHA entry after the ftlayer script with that SHA.

The machine running the tests is shared (Spark JVMs of other runs keep both
cores busy), so a server process can lose the CPU for a few hundred ms in the
middle of a plain HGET. What these tests measure is how long a *script* holds
the server, not the kernel's scheduling, so :func:`prioritised_server` starts a
dedicated server with a raised priority (nice -10 where allowed) and the probe
raises its own: both then get the CPU when they ask for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from types import TracebackType

import redis

from ftlayer.scripting import lua_source
from ftlayer.servers.embedded import EmbeddedServer

PRIORITY = -10


def raise_priority(pid: int) -> None:
    """Best effort: nice ``pid`` to :data:`PRIORITY` (needs privileges; ignored without them)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, PRIORITY)


def prioritised_server() -> EmbeddedServer:
    """A dedicated embedded server whose main thread runs at a raised priority, AOF off.

    AOF off: the disk is shared too, and an AOF write stalled behind another
    run's fsync blocks the server's main thread; durability is not under test.
    The latency monitor is on (20 ms), so :func:`latency_events` names any stall.
    """
    server = EmbeddedServer().start()
    assert server.pid is not None
    raise_priority(server.pid)
    client = redis.Redis.from_url(server.url)
    client.config_set("appendonly", "no")
    client.config_set("latency-monitor-threshold", 20)
    client.close()
    return server


def latency_events(client: redis.Redis) -> dict[str, int]:
    """The server's latency monitor: event name -> longest stall seen, ms."""
    raw = client.execute_command("LATENCY", "LATEST")  # type: ignore[no-untyped-call]
    return {(e[0].decode() if isinstance(e[0], bytes) else str(e[0])): int(e[3]) for e in raw}


_PROBE = r"""
import json, os, sys, threading, time
import redis
try:
    os.setpriority(os.PRIO_PROCESS, 0, -10)
except OSError:
    pass
c = redis.Redis.from_url(sys.argv[1], socket_timeout=30)
c.ping()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
samples = []
while not stop.is_set():
    t = time.perf_counter()
    c.ping()
    samples.append((time.perf_counter() - t) * 1000)
    time.sleep(0.002)
print(json.dumps(samples), flush=True)
"""


class PingProbe:
    """PING the server from another process while the ``with`` block runs; ``samples_ms`` after it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples_ms: list[float] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> PingProbe:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, self.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self._proc.stdout is not None
        assert self._proc.stdout.readline().strip() == "ready"
        time.sleep(0.05)  # a few samples before the work starts
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._proc is not None
        time.sleep(0.05)
        out, _ = self._proc.communicate("", timeout=60)
        self.samples_ms = json.loads(out.strip().splitlines()[-1])

    @property
    def max_ms(self) -> float:
        return max(self.samples_ms)


_BY_SHA = {lua_source.load(name).sha: name for name in lua_source.script_names()}


class ScriptTimes:
    """Slow log of the server, restricted to ftlayer scripts, from ``start()`` on."""

    def __init__(self, client: redis.Redis, slower_than_us: int = 2_000) -> None:
        self.client = client
        self.slower_than_us = slower_than_us
        self._saved: dict[str, str] = {}

    def start(self) -> ScriptTimes:
        self._saved = {k: str(v) for k, v in self.client.config_get("slowlog-*").items()}
        self.client.config_set("slowlog-log-slower-than", self.slower_than_us)
        self.client.config_set("slowlog-max-len", 100_000)
        self.client.slowlog_reset()
        self.client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
        return self

    def max_ms(self) -> dict[str, float]:
        """Longest run per script name, ms (scripts never slower than the threshold are absent)."""
        out: dict[str, float] = {}
        for entry in self.client.slowlog_get(100_000):
            cmd = entry["command"]
            parts = cmd.split() if isinstance(cmd, bytes) else str(cmd).split()
            if not parts or parts[0].upper() not in (b"EVALSHA", "EVALSHA"):
                continue
            sha = parts[1].decode() if isinstance(parts[1], bytes) else parts[1]
            name = _BY_SHA.get(sha, sha)
            out[name] = max(out.get(name, 0.0), entry["duration"] / 1000)
        return out

    def stop(self) -> None:
        for key, value in self._saved.items():
            self.client.config_set(key, value)

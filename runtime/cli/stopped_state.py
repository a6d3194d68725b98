"""The state of a topology that is not running, served for one CLI command (``status``, ``dlq``, ``sources``).

Why: a program run without ``redis_url`` (the README's tour) keeps its records, dead letters and
counters in the AOF of ``<state_dir>/<topology>/redis/``, and its embedded server stops with it. Once
the program has ended, ``ftlayer dlq list`` in the same directory should still show what it left.

Contract of :func:`serve_stopped_state`:

- only with no ``redis_url`` configured, the default ``state_dir`` layout (not ``:temp:``, not
  ``embedded_data_dir``; ``~`` expanded as the program expands it), for a topology whose server has
  run there (its ``redis/`` holds an AOF) and that no process runs (its ``lock`` is free): the one
  topology there, or the one the command names (``--topology``, or the TOPOLOGY argument);
- a running program keeps its own server: while one runs there (or the one named runs), the
  command is refused, and the reason names the process that holds the state and the URL it noted
  (a command without ``--topology`` is most likely about what runs: it never shows an older state
  instead). Two servers never share one AOF;
- the server is started as a re-run would start it (:meth:`TopologyState.open`, which takes the lock,
  then :meth:`~ftlayer.servers.state_dir.TopologyState.embedded_server`), lives as long as the
  command, and stops gracefully (AOF fsynced) when it ends, however it ends, releasing the lock.
  Meanwhile the topology's program cannot start (its state is in use by the command's process).
  What the command changes (``dlq requeue``, ``dlq purge``, ``sources reset``) is in the AOF for
  the next run;
- when nothing can be served, :func:`serve_stopped_state` says why in one line, for the error.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError, StateDirBusyError
from ftlayer.servers.state_dir import TopologyState

__all__ = ["StoppedState", "serve_stopped_state", "state_topologies"]


class StoppedState:
    """A stopped topology's state served for one command: ``url``; :meth:`close` stops the server
    (AOF fsynced) and releases the topology's lock. Idempotent."""

    def __init__(self, state: TopologyState, url: str) -> None:
        self.state = state
        self.url = url

    def close(self) -> None:
        self.state.close()


def _root(config: FTConfig) -> Path:
    return Path(config.state_dir).expanduser()


def state_topologies(config: FTConfig) -> list[str]:
    """Topologies under ``state_dir`` whose embedded server has run (an AOF in ``redis/``), by name."""
    if config.redis_url or config.state_temporary or config.embedded_data_dir:
        return []
    try:
        return sorted(path.parent.parent.name for path in _root(config).glob("*/redis/appendonlydir"))
    except OSError:
        return []


def _holder(lock: Path) -> str | None:
    """The pid written in the lock of a process that holds it, or None when it is free (probed with a
    descriptor of our own, so a lock held by this very process counts too)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 64).decode(errors="replace").strip() or "?"
        return None
    finally:
        os.close(fd)  # drops the probe's own lock


def _noted_url(config: FTConfig, name: str) -> str:
    try:
        return (_root(config) / name / "redis" / "url").read_text().strip()
    except OSError:
        return "?"


def _pick(config: FTConfig, topology: str | None) -> tuple[str | None, str]:
    """``(name, "")`` of the stopped topology to serve, or ``(None, why)`` (module contract)."""
    if config.state_temporary or config.embedded_data_dir:
        why = "state_dir is ':temp:'" if config.state_temporary else "embedded_data_dir is set"
        return None, f"{why}: there is no topology state here to read"
    root = _root(config)
    names = state_topologies(config)
    if topology is not None:
        if topology not in names:
            return None, f"no state of topology {topology!r} under {root} (an AOF in {root / topology / 'redis'})"
        names = [topology]
    if not names:
        return None, f"no topology has run under {root} with an embedded server"
    holders = {name: _holder(root / name / "lock") for name in names}
    running = [f"topology {name!r} is running (process {pid} holds {root / name}; its server: "
               f"{_noted_url(config, name)})" for name, pid in holders.items() if pid is not None]
    if running:  # what runs is what the command is most likely about: never show an older state instead
        return None, "; ".join(running) + ": pass its URL with --redis-url"
    if len(names) > 1:
        return None, f"topologies {', '.join(names)} under {root} are not running: pick one with --topology"
    return names[0], ""


def serve_stopped_state(config: FTConfig, command: str, topology: str | None = None) -> StoppedState | str:
    """A server started on a stopped topology's state (module contract), or why there is none (one line)."""
    name, why = _pick(config, topology)
    if name is None:
        return why
    root = _root(config)
    try:
        state = TopologyState.open(config, name)
    except StateDirBusyError:  # it started meanwhile: it serves its own state
        return f"topology {name!r} just started (it holds {root / name}): pass its URL with --redis-url"
    try:
        server = state.embedded_server(config)
    except FTLayerError as exc:
        state.close()
        log = root / name / "redis" / "valkey.log"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"the state of topology {name!r} ({state.redis_dir}) could not be served: {first} (see {log}; a "
                "damaged AOF is repaired with valkey-check-aof --fix)")
    except BaseException:
        state.close()
        raise
    print(f"ftlayer {command}: topology {name!r} is not running; serving its state ({state.redis_dir}) until "
          "this command ends (the topology cannot start meanwhile)", file=sys.stderr, flush=True)
    return StoppedState(state, server.url)

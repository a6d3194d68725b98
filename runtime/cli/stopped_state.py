"""The state of a topology that is not running, served for one CLI command (``status``, ``dlq``, ``sources``).

Why: a program run without ``redis_url`` (the README's tour) keeps its records, dead letters and
counters in the AOF of ``<state_dir>/<topology>/redis/``, and its embedded server stops with it. Once
the program has ended, ``ftlayer dlq list`` in the same directory should still show what it left.

Contract of :func:`serve_stopped_state`:

- only with no ``redis_url`` configured, the default ``state_dir`` layout (not ``:temp:``, not
  ``embedded_data_dir``), and exactly one topology there whose server has run (its ``redis/``
  holds an AOF), or the one the command's ``--topology`` names;
- only if no process runs that topology: the topology's ``lock`` is free. A running program keeps
  its own server, and the command says where it is instead (``embedded_url_hint``): two servers
  never share one AOF;
- the server is started as a re-run would start it (:meth:`TopologyState.open`, which takes the lock,
  then :meth:`~ftlayer.servers.state_dir.TopologyState.embedded_server`), lives as long as the
  command, and stops gracefully (AOF fsynced) when the process exits, releasing the lock. What the
  command changes (``dlq requeue``, ``dlq purge``, ``sources reset``) is in the AOF for the next run.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError, StateDirBusyError
from ftlayer.servers.state_dir import TopologyState

__all__ = ["StoppedState", "serve_stopped_state", "stopped_topologies"]


def stopped_topologies(config: FTConfig, topology: str | None = None) -> list[str]:
    """Topologies under ``state_dir`` whose embedded server has run (an AOF in ``redis/``), by name;
    only ``topology`` if given."""
    if config.redis_url or config.state_temporary or config.embedded_data_dir:
        return []
    root = Path(config.state_dir)
    try:
        names = sorted(path.parent.parent.name for path in root.glob("*/redis/appendonlydir"))
    except OSError:
        return []
    return [name for name in names if topology is None or name == topology]


def _running(lock: Path) -> bool:
    """True if a process holds the topology's lock (probed with a descriptor of our own, so a lock held
    by this very process counts too)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the probe's own lock
    return False


class StoppedState:
    """A stopped topology's state served for one command: ``url``; :meth:`close` stops the server
    (AOF fsynced) and releases the topology's lock. Idempotent."""

    def __init__(self, state: TopologyState, url: str) -> None:
        self.state = state
        self.url = url

    def close(self) -> None:
        self.state.close()


def serve_stopped_state(config: FTConfig, command: str, topology: str | None = None) -> StoppedState | None:
    """A server started on the one stopped topology's state (module contract), or None."""
    names = stopped_topologies(config, topology)
    if len(names) != 1:
        return None
    name = names[0]
    if _running(Path(config.state_dir) / name / "lock"):
        return None
    try:
        state = TopologyState.open(config, name)
    except StateDirBusyError:  # it started meanwhile: it serves its own state
        return None
    try:
        server = state.embedded_server(config)
    except FTLayerError:
        state.close()
        raise
    print(f"ftlayer {command}: topology {name!r} is not running; serving its state "
          f"({state.redis_dir}) until this command ends", file=sys.stderr, flush=True)
    return StoppedState(state, server.url)

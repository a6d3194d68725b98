"""Free TCP ports on the loopback for the servers this process starts.

Contract: :func:`free_port` returns a port on 127.0.0.1 that was free a moment ago, drawn below
the kernel's ephemeral range where it can, so a server killed and restarted on it finds it free.
A drawn port can still be bound by another process before the server binds it (several test
workers start servers side by side); then a connection to it reaches that other process, so a
server's start checks with :func:`listens_on` that the listener is its own.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from pathlib import Path

__all__ = ["PORT_DRAWS", "PORT_TAKEN", "free_port", "listens_on", "start_redrawing"]

PORT_DRAWS = 5  # first starts on freshly drawn ports before a taken port is an error
PORT_TAKEN = "Address already in use"  # what a server says (log, error) when its port was taken
_LISTEN_PORTS_FROM = 10_000  # lowest port free_port() hands out (below: well-known and registered services)
_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range (client sockets' local ports), if known."""
    try:
        low = int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return low if low > _LISTEN_PORTS_FROM + 1000 else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, outside the ephemeral range where it can.

    A server killed and restarted on the same port (fault tests, cluster nodes that
    rejoin) must find it free again. A port the kernel may give any client socket as
    its local port can be taken by then (seen: a cluster node failing to rejoin with
    "Address already in use"), so on Linux the port is drawn at random below the
    ephemeral range (``ip_local_port_range``), where only explicit binds land; elsewhere,
    or if 64 draws are all taken, the kernel picks one.
    """
    low = _ephemeral_low()
    if low is not None:
        draw = random.SystemRandom()
        for _ in range(64):
            port = draw.randrange(_LISTEN_PORTS_FROM, low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes of the TCP listeners on ``port`` (IPv4 and IPv6), from /proc/net."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listens_on(pid: int, port: int) -> bool:
    """True if process ``pid`` holds a TCP listening socket on ``port`` (Linux /proc); True where
    /proc cannot tell (no such tables: another OS), False if another process holds the listener."""
    if not Path("/proc/net/tcp").exists():
        return True
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def start_redrawing(start_once: Callable[[], None], redraw: Callable[[], None],
                    taken: Callable[[Exception], bool], *, draws: int = PORT_DRAWS) -> None:
    """``start_once()``; while it raises an error ``taken`` says came from a port another process
    bound first, ``redraw()`` (draw new ports) and start again, ``draws`` starts in all; the last
    error is raised. ``draws=1``: one start, no redraw (a given port, a restart)."""
    for left in range(draws - 1, -1, -1):
        try:
            start_once()
        except Exception as exc:
            if left == 0 or not taken(exc):
                raise
            redraw()
        else:
            return

"""The HTTP front process of a webhook receiver, seen from outside (for the chaos scenarios that kill it)."""

from __future__ import annotations

import os


def front_pid(ingest_pid: int) -> int | None:
    """The pid of the HTTP front process (runtime.driver.webhook_front) of the process ``ingest_pid`` (an
    ``ftlayer ingest --webhook``, or a driver with a ``WebhookSource``); None if it has none now."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == ingest_pid and b"runtime.driver.webhook_front" in command:
            return int(name)
    return None

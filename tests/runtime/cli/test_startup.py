"""The ``ftlayer`` command line starts without the heavy stack (issue 26).

Parsing the command line and running the light commands (``--version``, ``--help``, ``config``,
``status``, ``dlq``, ``sources``, ``doctor --only server``, a bad option) import neither PySpark nor
the DataFrame stack (pandas, pyarrow, numpy), nor the topology compiler, the chaos harness or the
benchmarks: those cost ~1.4 CPU-seconds per invocation, paid by every ``ftlayer status`` and every
test that runs the CLI as a process. The commands that need them (``chaos``, ``bench``, ``demo``)
import them when they run. Each case runs the real ``python -X importtime -m ftlayer`` against the
test server and reads the modules it imported from importtime's lines on stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# a module is heavy if it is one of these or under one of them
HEAVY = ("pyspark", "pandas", "pyarrow", "numpy", "runtime.spark", "runtime.topology", "runtime.chaos.base",
         "runtime.chaos.runner", "runtime.bench")

# (argv, the exit status the command ends with against a clean namespace of the test server)
LIGHT: list[tuple[tuple[str, ...], int]] = [
    (("--version",), 0),
    (("--help",), 0),
    (("chaos", "--help"), 0),  # the scenarios' names and summaries come from runtime.chaos.catalog
    (("bench", "--help"), 0),
    (("config", "-o", "json"), 0),
    (("status", "-o", "json", "--interval", "0"), 0),
    (("dlq", "list"), 0),
    (("sources", "list"), 0),
    (("status", "--no-such-option"), 2),  # the usage and one error line, no traceback
    (("chaos", "no-such-scenario"), 2),
]


def imported_modules(importtime_stderr: str) -> set[str]:
    """The modules named by ``python -X importtime``'s lines (``import time: self | cumulative | name``)."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:"):
            name = line.rsplit("|", 1)[-1].strip()
            if name != "imported package":  # the header line
                names.add(name)
    return names


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def _run_importtime(argv: tuple[str, ...], redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FTLAYER_REDIS_URL": redis_url,
           "FTLAYER_NAMESPACE": f"startup{uuid.uuid4().hex[:8]}"}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "ftlayer", *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120, check=False)


@pytest.mark.parametrize(("argv", "status"), LIGHT, ids=[" ".join(a) for a, _ in LIGHT])
def test_light_commands_import_no_heavy_module(argv: tuple[str, ...], status: int, redis_server_url: str) -> None:
    got = _run_importtime(argv, redis_server_url)
    assert got.returncode == status, got.stderr[-2000:]
    assert "Traceback" not in got.stdout + got.stderr
    modules = imported_modules(got.stderr)
    assert "runtime.cli.main" in modules  # the command line itself was timed: the parse below is not vacuous
    found = heavy(modules)
    roots = sorted({h for h in HEAVY for m in found if m == h or m.startswith(h + ".")})
    assert found == [], f"ftlayer {' '.join(argv)} imported {roots} ({len(found)} modules)"


def test_doctor_server_checks_import_no_heavy_module(redis_server_url: str) -> None:
    # the Spark checks import pyspark on purpose (is it importable?); the server checks need none of it
    got = _run_importtime(("doctor", "--only", "server", "-o", "json"), redis_server_url)
    assert got.returncode in (0, 1), got.stderr[-2000:]  # 1: a check failed on this server (CI's redis-server)
    assert '"checks"' in got.stdout and "Traceback" not in got.stderr
    assert heavy(imported_modules(got.stderr)) == []


def test_the_parse_sees_a_heavy_import() -> None:
    """The check itself: a process that does import PySpark is caught (so an empty list means something)."""
    got = subprocess.run([sys.executable, "-X", "importtime", "-c", "import runtime.topology"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                         timeout=120, check=False)
    assert got.returncode == 0, got.stderr[-2000:]
    found = heavy(imported_modules(got.stderr))
    assert "pyspark" in found and "runtime.topology" in found

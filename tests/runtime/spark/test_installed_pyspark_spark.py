"""An ftlayer DataFrame query's Spark-launched Python processes (the FT source's planners and its
streaming runner, the daemon's task workers) import pyspark and py4j from the installed, compiled
copy when their interpreter has ftlayer's start-up hook, and from Spark's zips when opted out
(runtime/spark/installed_pyspark.py).

The driver app (``origin_app.py``) runs with the Python of a venv of its own (``layered_venv``: the
hook of this checkout, and the tests' probe, which records each Spark-launched process's path and
where ``pyspark`` resolves), so its workers run that Python too (``local_session`` sets
``PYSPARK_PYTHON`` to the driver's).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ftlayer.config import ENV_PREFIX
from runtime.spark.installed_pyspark import OPT_OUT_ENV
from tests.runtime.spark.layered_venv import ROOT, layered_venv

pytestmark = [pytest.mark.spark, pytest.mark.slow]
APP = Path(__file__).with_name("origin_app.py")


def run_app(python: Path, cwd: Path, **env: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    probes = cwd / "probes"
    probes.mkdir()
    # PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON go too: a session started earlier in this test process
    # sets them to its own Python (local_session), and the app's Spark would run that, not the venv's
    dropped = {"PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"}
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX) and k not in dropped}
    environ.update(PYTHONPATH=str(ROOT), PYSPARK_ORIGIN_PROBE_DIR=str(probes), **env)
    proc = subprocess.run([str(python), str(APP)], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    stats = result["stats"]
    assert isinstance(stats, dict) and stats["persisted"] == 20 and stats["pending"] == 0, stats
    return result, [json.loads(p.read_text()) for p in sorted(probes.iterdir())]


def by_kind(records: list[dict[str, object]]) -> dict[str, list[dict[str, object]]]:
    """The probe records by process: runner, task workers' daemon, planners' daemons."""
    kinds: dict[str, list[dict[str, object]]] = {"runner": [], "worker": [], "planner": []}
    for r in records:
        argv = " ".join(r["argv"])  # type: ignore[arg-type]
        if "python_streaming_source_runner" in argv:
            kinds["runner"].append(r)
        elif argv.endswith("pyspark.daemon pyspark.worker"):
            kinds["worker"].append(r)
        elif "pyspark.sql.worker." in argv:
            kinds["planner"].append(r)
    assert all(kinds.values()), {k: len(v) for k, v in kinds.items()}
    return kinds


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layered_venv(tmp_path_factory.mktemp("venv") / "v", probe=True)


def installed_home() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def test_the_query_s_python_processes_import_the_installed_pyspark(python: Path, tmp_path: Path) -> None:
    home = installed_home()
    result, records = run_app(python, tmp_path)
    assert result["tasks"] == [f"{home / '__init__.py'}|{home.parent / 'py4j' / '__init__.py'}"]
    for kind, found in by_kind(records).items():
        for r in found:
            assert r["pyspark"] == str(home / "__init__.py"), (kind, r)
            assert r["py4j"] == str(home.parent / "py4j" / "__init__.py"), (kind, r)
            assert not [p for p in r["path"] if p.endswith((".zip", ".jar")) and str(home) in p], (kind, r)  # type: ignore[union-attr]


def test_opted_out_the_query_s_python_processes_import_spark_s_zips(python: Path, tmp_path: Path) -> None:
    lib = installed_home() / "python" / "lib"
    (py4j_zip,) = lib.glob("py4j-*-src.zip")
    result, records = run_app(python, tmp_path, **{OPT_OUT_ENV: "1"})
    assert result["tasks"] == [f"{lib / 'pyspark.zip'}/pyspark/__init__.py|{py4j_zip}/py4j/__init__.py"]
    for kind, found in by_kind(records).items():
        for r in found:
            assert r["pyspark"] == f"{lib / 'pyspark.zip'}/pyspark/__init__.py", (kind, r)
            assert r["py4j"] == f"{py4j_zip}/py4j/__init__.py", (kind, r)

"""The distribution installs into a clean venv from its built wheel, and its commands run from there
(issue 31 item 5; the README's DataFrame tour from the same venv: ``test_shipped_env.py``).

Every command runs with the environment of :func:`tests.distribution.builds.clean_env` (no ``PYTHONPATH``,
the dev venv off ``PATH``) from a scratch directory, so nothing can come from this checkout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.distribution.builds import ROOT, Dist, clean_env

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.slow  # the first test builds the wheel and two venvs (about a minute)

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120, check=False)


def test_the_wheel_installs_and_its_commands_run_from_the_venv(dist: Dist, tmp_path: Path) -> None:
    print(f"distribution build steps (s): {dist.timings_s}")
    assert dist.wheel.name == f"ftlayer-{VERSION}-py3-none-any.whl"

    version = run([str(dist.bin / "ftlayer"), "--version"], tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"ftlayer {VERSION}"

    helped = run([str(dist.python), "-m", "ftlayer", "--help"], tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: ftlayer"), helped.stdout[:300]
    assert "status" in helped.stdout and "dlq" in helped.stdout

    # the modules, the Lua scripts (package data) and the typing marker come from the venv's site-packages
    where = run([str(dist.python), "-c", "import ftlayer, runtime, serialization, partitioners\n"
                 "from ftlayer.scripting.lua_source import load, script_names\n"
                 "import importlib.resources as r\n"
                 "print(ftlayer.__file__, runtime.__file__, serialization.__file__, partitioners.__file__)\n"
                 "print(sum(bool(load(n).text) for n in script_names()), "
                 "r.files('ftlayer').joinpath('py.typed').is_file())"], tmp_path)
    assert where.returncode == 0, where.stderr
    files, lua = where.stdout.splitlines()
    site = str(dist.bin.parent / "lib")
    assert all(f.startswith(site) for f in files.split()), files
    scripts, typed = lua.split()  # every script loads, its library includes expanded
    assert int(scripts) == len(list((ROOT / "ftlayer" / "lua").glob("*.lua"))) and typed == "True"


def test_the_wheel_installs_the_start_up_hook_for_spark_s_python_processes(dist: Dist, tmp_path: Path) -> None:
    """``ftlayer-installed-pyspark.pth`` lands in site-packages (setup.py), and a Python process with the
    path Spark gives its workers imports the venv's pyspark and py4j, not the zips
    (runtime/spark/installed_pyspark.py)."""
    home = dist.spark_home
    (hook,) = (home.parent).glob("ftlayer-installed-pyspark.pth")
    assert hook.read_text() == (ROOT / "runtime" / "spark" / hook.name).read_text()
    (py4j_zip,) = (home / "python" / "lib").glob("py4j-*-src.zip")
    spark_path = f"{home / 'python' / 'lib' / 'pyspark.zip'}:{py4j_zip}"
    show = "import pyspark, py4j; print(pyspark.__file__, py4j.__file__)"
    env = clean_env(PYTHONPATH=spark_path)
    hooked = subprocess.run([str(dist.python), "-c", show], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert hooked.returncode == 0 and not hooked.stderr, hooked.stderr
    assert hooked.stdout.split() == [str(home / "__init__.py"), str(home.parent / "py4j" / "__init__.py")]
    env["FTLAYER_KEEP_PYSPARK_ZIP"] = "1"
    kept = subprocess.run([str(dist.python), "-c", show], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert kept.stdout.split() == [f"{home / 'python' / 'lib' / 'pyspark.zip'}/pyspark/__init__.py",
                                   f"{py4j_zip}/py4j/__init__.py"], kept.stderr

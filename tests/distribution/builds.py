"""Build ftlayer's distribution the way a user installs it: a wheel from the repository, a clean venv
that installs it, and the packed executor environment that ``--archives`` ships (docs/operations.md,
"Shipping the Python environment to executors").

The steps, each a function a test or a person can run alone:

- :func:`build_wheel`: ``pip wheel --no-deps`` on a copy of the distribution's files (the package
  directories, ``pyproject.toml``, ``setup.py``, ``README.md``), so the build writes nothing into the checkout
  and sees no untracked ``build/`` or ``*.egg-info`` left there;
- :func:`make_venv`: ``python -m venv --copies --without-pip`` (the interpreter copied, not
  symlinked; pip runs from outside with ``pip --python``, so the venv carries no pip);
- :func:`pip_install`: ``pip --python VENV/bin/python install --no-compile ...`` from the package index
  (pip's cache makes repeat installs local);
- :func:`pack_venv`: a ``.tar.gz`` of the venv's contents (``bin``, ``lib``, ``pyvenv.cfg``) at the
  archive's top level, gzip -1. Two things Spark's unpacking needs: no ``./`` entry (Hadoop's tar
  reader refuses "expanding ./ would create entry outside ...") and gzip: a plain ``.tar`` is
  unpacked in Java without file modes, so ``environment/bin/python`` is not executable there
  ("error=13, Permission denied"); a ``.tar.gz`` goes through ``tar`` and keeps them.

:class:`Dist` gathers them for the tests (``tests/distribution/conftest.py`` builds it once per run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ftlayer", "runtime", "serialization", "partitioners")
DIST_FILES = ("pyproject.toml", "setup.py", "README.md")
PIP_TIMEOUT_S = 600.0


class BuildError(RuntimeError):
    """A build step failed; the message has the command and its output's tail."""


def _run(cmd: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None,
         timeout_s: float = PIP_TIMEOUT_S) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=dict(env) if env is not None else None, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if proc.returncode != 0:
        msg = f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        raise BuildError(msg)
    return proc.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would let a child import ftlayer from elsewhere.

    Drops ``PYTHONPATH``, ``VIRTUAL_ENV``, ``PYSPARK_PYTHON``/``PYSPARK_DRIVER_PYTHON``, ``SPARK_HOME``,
    ``PYTHONDONTWRITEBYTECODE`` (the venvs are installed ``--no-compile``: their interpreters are to
    cache what they import; with it set, every driver, planner and executor process compiled
    pyspark and ftlayer anew) and every ``FTLAYER_*`` setting, and takes this interpreter's venv
    (``sys.prefix/bin``, the dev venv with ftlayer installed editable) off ``PATH``; then sets ``extra``.
    """
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "PYTHONHOME",
            "PYTHONDONTWRITEBYTECODE"}
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("FTLAYER_")}
    own_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != own_bin)
    env.update(extra)
    return env


def build_wheel(out_dir: Path, root: Path = ROOT) -> Path:
    """Build ftlayer's wheel from ``root`` into ``out_dir``; returns the wheel's path.

    The distribution's files are copied to ``out_dir/src`` first (no ``__pycache__``), and pip builds
    there in an isolated build environment (setuptools from pyproject's ``[build-system]``).
    """
    src = out_dir / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in DIST_FILES:
        shutil.copy2(root / name, src / name)
    for name in PACKAGES:
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = out_dir / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(src)],
         cwd=out_dir, env=clean_env())
    found = sorted(wheels.glob("ftlayer-*.whl"))
    if len(found) != 1:
        msg = f"expected one ftlayer wheel in {wheels}, found {[p.name for p in found]}"
        raise BuildError(msg)
    return found[0]


def make_venv(path: Path) -> Path:
    """A new venv at ``path`` with the interpreter copied (``--copies``) and no pip; its ``bin/python``."""
    _run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(path)], env=clean_env())
    return path / "bin" / "python"


def pip_install(python: Path, *requirements: str) -> None:
    """``pip install`` ``requirements`` into the venv of ``python`` (pip runs from this interpreter).

    ``--no-compile``: pip would byte-compile every module it installs (pyspark's, numpy's, ...),
    about half of the install's CPU; the interpreters compile, and cache, only what they import."""
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile", *requirements],
         env=clean_env())


def pack_venv(venv: Path, archive: Path) -> Path:
    """Pack ``venv``'s contents into ``archive`` (a ``.tar.gz``) for ``--archives archive#environment``.

    The members sit at the archive's top level (``bin/python``, ``lib/...``, ``pyvenv.cfg``); ``lib64``
    (a symlink to ``lib``) and the empty ``include`` are left out.
    """
    if not archive.name.endswith((".tar.gz", ".tgz")):
        msg = f"{archive.name}: Spark keeps file modes only for .tar.gz/.tgz (a plain .tar loses bin/python's x bit)"
        raise BuildError(msg)
    members = [name for name in ("bin", "lib", "pyvenv.cfg") if (venv / name).exists()]
    _run(["bash", "-c", 'set -o pipefail; tar -C "$1" -c "${@:3}" | gzip -1 > "$2"', "pack", str(venv), str(archive),
          *members])
    return archive


@dataclass
class Dist:
    """ftlayer installed from its wheel, for the distribution tests.

    - ``wheel``: the built wheel;
    - ``archive``: the executor environment (``pip install <wheel>``: the core dependencies only),
      packed for ``--archives``;
    - ``python``: a clean venv's interpreter that installed ``<wheel>[spark]`` (the driver's side:
      pyspark, the embedded server, the CLI) after the archive was packed from it;
    - ``bare_python``: a venv with nothing installed (what an executor without the archive has);
    - ``timings_s``: how long each step took.
    """

    wheel: Path
    archive: Path
    python: Path
    bare_python: Path
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def bin(self) -> Path:
        return self.python.parent

    @property
    def spark_home(self) -> Path:
        """The pip-installed pyspark of the driver venv (what ``spark-submit`` needs as ``SPARK_HOME``)."""
        found = sorted((self.bin.parent / "lib").glob("python3*/site-packages/pyspark"))
        if not found:
            msg = f"no pyspark in {self.bin.parent}"
            raise BuildError(msg)
        return found[0]


def build_dist(work: Path, root: Path = ROOT) -> Dist:
    """Build the wheel, the executor archive and the driver venv under ``work`` (see :class:`Dist`).

    One venv serves both: ``pip install <wheel>`` (what an executor gets), packed, then
    ``pip install <wheel>[spark]`` into the same venv for the driver; the archive is what the
    executors import from, the venv what the driver imports from.
    """
    timings: dict[str, float] = {}

    def step(name: str, start: float) -> None:
        timings[name] = round(time.monotonic() - start, 1)

    t = time.monotonic()
    wheel = build_wheel(work / "build", root)
    step("wheel", t)
    t = time.monotonic()
    python = make_venv(work / "venv")
    pip_install(python, str(wheel))
    step("executor_install", t)
    t = time.monotonic()
    archive = pack_venv(work / "venv", work / "ftlayer-executor-env.tar.gz")
    step("pack", t)
    t = time.monotonic()
    pip_install(python, f"{wheel}[spark]")
    step("driver_install", t)
    bare = make_venv(work / "bare")
    return Dist(wheel=wheel, archive=archive, python=python, bare_python=bare, timings_s=timings)

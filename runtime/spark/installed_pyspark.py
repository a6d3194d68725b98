"""Spark's Python processes import pyspark (and py4j) from the installed, compiled copy, not from
``pyspark.zip``, when the zip is that very installation's.

Why. Spark starts every Python process it needs (the ``pyspark.daemon`` and the workers it forks,
the planners of Python data sources, a Python streaming source's runner) with
``$SPARK_HOME/python/lib/pyspark.zip``, the py4j ``-src.zip`` and the spark-core jar first on its
``PYTHONPATH`` (Scala ``PythonUtils.sparkPythonPath``). zipimport never reads or writes bytecode
caches, so each such process compiles pyspark from source (``import pyspark.sql, pyspark.worker``:
~1.5 s of CPU from the zips against ~0.3 s from site-packages on the reference machine), and each
``importlib.invalidate_caches()`` (pyspark's ``setup_spark_files``) re-reads the directory of
every zip and jar (~45 ms, the jar's 6,000 entries most of it). With a pip-installed pyspark,
``SPARK_HOME`` is ``site-packages/pyspark`` and the zip holds the same sources as the installed
package beside it, whose ``__pycache__`` is compiled.

Contract of :func:`redundant_entries` (pure: it only looks at files): for each entry
``<home>/python/lib/pyspark.zip`` of the path, where the first directory of the path that holds
``pyspark/__init__.py`` holds it as ``<home>`` itself (the same installation), the entries it
returns are that zip, ``<home>/python/lib/py4j-<v>-src.zip`` when the first py4j package on the
path has version ``<v>`` too, and the jars of ``<home>/jars/`` (a pip-installed pyspark's
spark-core jar carries no Python: Spark adds it for assemblies that did). Anything else, a
``SPARK_HOME`` that is a Spark distribution or another pyspark than the one installed, keeps
every entry. :func:`prefer_installed` takes them out of ``sys.path`` and
``sys.path_importer_cache`` (so later ``invalidate_caches()`` calls no longer re-read them),
unless ``FTLAYER_KEEP_PYSPARK_ZIP=1`` (the opt-out).

How it runs: a start-up hook, ``ftlayer-installed-pyspark.pth`` (this directory; the wheel puts
it in site-packages through setup.py, ``scripts/_venv.sh`` into the dev venv), whose one line
imports this module only when ``PYTHONPATH`` names ``pyspark.zip`` and the module is importable
(a checkout of another branch first on ``PYTHONPATH`` is left alone), so any other Python start in
the venv pays one environment lookup. The zips' directories are still read once per process (the
interpreter imports ``encodings`` through them before ``site`` runs): what goes is the compiling
and the re-reads. Chosen over a daemon module of ours
(``spark.python.daemon.module``): Spark starts a streaming Python source's runner itself
(``python -m pyspark.sql.streaming.python_streaming_source_runner``, no daemon), and a daemon
module covers only the sessions whose conf names it, where the hook covers every Python process
of every session whose workers run this venv's interpreter, a user's own SparkSession included.
Nothing is imported here beyond ``os`` and ``sys`` (already loaded at start-up): importing
pyarrow, pandas or numpy before the daemon forks would start threads (pyspark's daemon.py).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["OPT_OUT_ENV", "PTH_NAME", "prefer_installed", "redundant_entries"]

OPT_OUT_ENV = "FTLAYER_KEEP_PYSPARK_ZIP"
PTH_NAME = "ftlayer-installed-pyspark.pth"  # sorts after setuptools' __editable__*.pth (its finder first)
PY4J_PREFIX, PY4J_SUFFIX = "py4j-", "-src.zip"


def _python_lib(entry: str) -> tuple[str, str] | None:
    """``(<home>, <name>)`` of an entry ``<home>/python/lib/<name>``, else None."""
    lib, name = os.path.split(entry)
    python, lib_name = os.path.split(lib)
    home, python_name = os.path.split(python)
    return (home, name) if (lib_name, python_name) == ("lib", "python") else None


def _zip_home(entry: str) -> str | None:
    """``<home>`` of an entry ``<home>/python/lib/pyspark.zip``, else None."""
    found = _python_lib(entry)
    return found[0] if found is not None and found[1] == "pyspark.zip" else None


def _first_package(path: Sequence[str], package: str) -> str | None:
    """The package directory ``<entry>/<package>`` of the first path entry that holds one, as import
    finds it among directories ('' is the working directory; zips hold no directory here)."""
    for entry in path:
        candidate = os.path.join(entry or os.curdir, package)
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return candidate
    return None


def _py4j_version(package_dir: str) -> str | None:
    """``__version__`` of an installed py4j, read from its ``version.py`` (not imported)."""
    try:
        with open(os.path.join(package_dir, "version.py"), encoding="utf-8") as f:
            for line in f:
                name, sep, value = line.partition("=")
                if sep and name.strip() == "__version__":
                    return value.strip().strip("'\"")
    except OSError:
        return None
    return None


def _same_dir(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def redundant_entries(path: Sequence[str]) -> list[str]:
    """The entries of ``path`` that duplicate the installed pyspark and py4j (module docstring)."""
    homes = {home for home in map(_zip_home, path) if home is not None}
    if not homes:
        return []
    installed = _first_package(path, "pyspark")
    homes = {home for home in homes if installed is not None and _same_dir(home, installed)}
    if not homes:
        return []
    py4j = _first_package(path, "py4j")
    py4j_version = _py4j_version(py4j) if py4j is not None else None
    own = {"pyspark.zip"} | ({f"{PY4J_PREFIX}{py4j_version}{PY4J_SUFFIX}"} if py4j_version is not None else set())
    out: list[str] = []
    for entry in path:
        in_lib = _python_lib(entry)
        parent, name = os.path.split(entry)
        zipped = in_lib is not None and in_lib[0] in homes and name in own
        jar = name.endswith(".jar") and os.path.basename(parent) == "jars" and os.path.dirname(parent) in homes
        if zipped or jar:
            out.append(entry)
    return out


def prefer_installed(environ: Mapping[str, str] | None = None, path: list[str] | None = None) -> list[str]:
    """Take :func:`redundant_entries` out of ``path`` (default ``sys.path``, then also out of
    ``sys.path_importer_cache``); returns them. Nothing when ``FTLAYER_KEEP_PYSPARK_ZIP=1``."""
    environ = os.environ if environ is None else environ
    if environ.get(OPT_OUT_ENV, "") == "1":
        return []
    target = sys.path if path is None else path
    removed = redundant_entries(target)
    for entry in removed:
        while entry in target:
            target.remove(entry)
        if path is None:
            sys.path_importer_cache.pop(entry, None)
    return removed

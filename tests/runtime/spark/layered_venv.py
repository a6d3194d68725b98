"""A throwaway venv over this test run's venv, with ftlayer's start-up hook (and optionally the tests'
origin probe) installed as real ``.pth`` files, for the tests of runtime/spark/installed_pyspark.py.

The dev venv is shared and gets the hook only through scripts/_venv.sh; these tests must test this
checkout's hook file, so they make their own venv (``python -m venv --without-pip``, well under a
second) whose first ``.pth`` adds the dev venv's site-packages with ``site.addsitedir`` (its own
``.pth`` files included, so the packages import as in the dev venv), then ftlayer's hook, copied
from ``runtime/spark/``, then the probe. Processes of this venv's Python need this checkout on
``PYTHONPATH`` (the hook imports ``runtime.spark.installed_pyspark``).
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HOOK = ROOT / "runtime" / "spark" / "ftlayer-installed-pyspark.pth"
PROBE_LINE = "import tests.runtime.spark.origin_probe as p; p.record()\n"


def layered_venv(path: Path, *, hook: bool = True, probe: bool = False) -> Path:
    """Create the venv at ``path``; its ``bin/python``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, capture_output=True)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    dev_site = sysconfig.get_paths()["purelib"]
    (site / "00-dev-venv.pth").write_text(f"import site; site.addsitedir({dev_site!r})\n")
    if hook:
        (site / HOOK.name).write_text(HOOK.read_text())
    if probe:
        (site / "zz-origin-probe.pth").write_text(PROBE_LINE)
    return python

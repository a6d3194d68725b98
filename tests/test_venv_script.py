"""``scripts/_venv.sh`` (sourced by every script) byte-compiles the checkout.

Where ``PYTHONDONTWRITEBYTECODE`` is set (this project's CI machines set it), no Python process
caches what it compiles, so each of the suite's and the demo's Spark workers, planner and source
runner processes, subprocess drivers and CLI calls compiled ftlayer from source again. The script
compiles every module once; the test points the caches at a temporary ``PYTHONPYCACHEPREFIX`` so
that it writes nothing into the checkout, and checks a current .pyc exists for every module.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILED = ("ftlayer", "runtime", "serialization", "partitioners", "tests")


def _cached_under(prefix: Path, source: Path) -> Path:
    """Where an interpreter with ``sys.pycache_prefix = prefix`` looks for ``source``'s bytecode."""
    tag = sys.implementation.cache_tag
    return prefix / source.parent.relative_to("/") / f"{source.stem}.{tag}.pyc"


def test_sourcing_the_venv_script_compiles_every_module_of_the_checkout(tmp_path: Path) -> None:
    prefix = tmp_path / "pycache"
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONDONTWRITEBYTECODE": "1",
           "FTLAYER_VENV": str(Path(sys.prefix))}
    proc = subprocess.run(["bash", "-c", f'source "{ROOT}/scripts/_venv.sh"'], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sources = [p for top in COMPILED for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(sources) > 300
    missing = [str(p.relative_to(ROOT)) for p in sources if not _cached_under(prefix, p).is_file()]
    assert not missing, f"not compiled by scripts/_venv.sh: {missing[:10]} ({len(missing)} in all)"
    # a current cache: the header's source mtime and size are the file's (importlib checks both)
    probe = ROOT / "ftlayer" / "errors.py"
    data = _cached_under(prefix, probe).read_bytes()
    stat = probe.stat()
    assert int.from_bytes(data[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
    assert int.from_bytes(data[12:16], "little") == stat.st_size & 0xFFFFFFFF
    assert data[:4] == importlib.util.MAGIC_NUMBER

"""The import contract (pyproject.toml's [tool.importlinter], run by scripts/test with lint-imports)
holds, and it catches an import that runs back up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ftlayer", "runtime", "serialization", "partitioners")


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = Path(sys.executable).parent / "lint-imports"
    if not tool.exists():
        pytest.fail("lint-imports is not installed (import-linter, a dev dependency: scripts/_venv.sh installs it)")
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(tool), "--no-logo", "--no-cache"], cwd=cwd, env=env, capture_output=True,
                          text=True, check=False, timeout=120)


def _copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_house_keeps_its_import_contract() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("importer", "imported", "contract"), [
    ("ftlayer/errors.py", "runtime.trigger", "The core (ftlayer/) imports no other package"),
    ("serialization/payload.py", "partitioners.base", "neither imports the other"),
    ("runtime/driver/feed.py", "runtime.spark.conf", "runtime/ in floors"),
    ("ftlayer/records/ids.py", "ftlayer.store.connection", "The core in floors"),
    ("ftlayer/acker/holds.py", "ftlayer.acker.persistence", "ftlayer/acker/ in floors"),
    ("ftlayer/acker/dead_letter_ids.py", "ftlayer.acker.dead_letters", "ftlayer/acker/ in floors"),
    ("ftlayer/config/checks.py", "ftlayer.config.options", "ftlayer/config/ in floors"),
    ("ftlayer/servers/ports.py", "ftlayer.servers.embedded", "ftlayer/servers/ in floors"),
])
def test_an_import_that_runs_back_up_is_reported(tmp_path: Path, importer: str, imported: str, contract: str) -> None:
    root = _copy(tmp_path)
    module = root / importer
    module.write_text(module.read_text() + f"\nimport {imported}  # noqa: E402\n")
    done = _lint_imports(root)
    assert done.returncode != 0
    assert contract in done.stdout and imported in done.stdout, done.stdout

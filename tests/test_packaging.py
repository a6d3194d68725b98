"""Every package directory of the distribution is listed in pyproject.toml (a wheel would miss it otherwise)."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_packaged() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("ftlayer", "serialization", "partitioners", "runtime")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found == listed

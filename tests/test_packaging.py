"""Every package directory of the distribution is listed in pyproject.toml (a wheel would miss it otherwise)."""

from __future__ import annotations

import fnmatch
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
    # the Lua folders are data directories (no __init__.py) that setuptools wants listed as packages
    data_dirs = {"ftlayer.lua", "ftlayer.lua.lib"}
    assert found == listed - data_dirs
    assert data_dirs <= listed


def test_every_lua_file_is_package_data() -> None:
    """The scripts are read from ``ftlayer/lua/`` at run time (``ftlayer.scripting.lua_source``):
    a wheel must carry them."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ftlayer"]
    files = [p.relative_to(ROOT / "ftlayer").as_posix() for p in (ROOT / "ftlayer").rglob("*.lua")]
    assert files
    # setuptools globs match one path level per '*', as PurePosixPath.match does from the left here
    missing = [f for f in files if not any(fnmatch.fnmatch(f, pat) and f.count("/") == pat.count("/")
                                           for pat in patterns)]
    assert not missing, f"not declared as package data of ftlayer in pyproject.toml: {missing}"

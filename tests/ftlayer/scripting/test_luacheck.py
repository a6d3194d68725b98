"""The server-side Lua passes luacheck (Debian's lua-check, installed by scripts/_venv.sh), and the
configuration (.luacheckrc) knows each file's names from the files themselves."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _luacheck(cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("luacheck")
    if tool is None:
        pytest.fail("luacheck is not installed (Debian: apt-get install lua-check; scripts/_venv.sh does it as root)")
    return subprocess.run([tool, "--no-color", "ftlayer/lua"], cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=120)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "ftlayer" / "lua", tmp_path / "ftlayer" / "lua")
    (tmp_path / "ftlayer" / "scripting").mkdir()
    shutil.copy(ROOT / "ftlayer" / "scripting" / "lua_layout.py", tmp_path / "ftlayer" / "scripting" / "lua_layout.py")
    shutil.copy(ROOT / ".luacheckrc", tmp_path / ".luacheckrc")
    return tmp_path


def test_the_lua_passes_luacheck() -> None:
    done = _luacheck(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 warnings / 0 errors in" in done.stdout


def test_a_library_name_used_without_its_include_is_reported(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    script = root / "ftlayer" / "lua" / "trim_done.lua"
    script.write_text(script.read_text().replace("--@include lib/entry.lua\n", ""))
    done = _luacheck(root)
    assert done.returncode != 0
    assert "trim_done.lua" in done.stdout and "accessing undefined variable 'entry_fields'" in done.stdout


def test_a_layout_name_the_layout_does_not_define_is_reported(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    layout = root / "ftlayer" / "scripting" / "lua_layout.py"
    layout.write_text(layout.read_text().replace("local FLAG_REFILED, FLAG_SEEN =", "local FLAG_REFILED =", 1))
    done = _luacheck(root)
    assert done.returncode != 0
    assert "accessing undefined variable 'FLAG_SEEN'" in done.stdout, done.stdout

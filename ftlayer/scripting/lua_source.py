"""The server-side Lua scripts, read from the ``.lua`` files under ``ftlayer/lua/`` (package data).

One file per script (``ftlayer/lua/<name>.lua``, run as ``<NAME>``) and the
library files they share (``ftlayer/lua/lib/*.lua``). A script file starts with a
comment stating its KEYS, ARGV and reply, and names each library file it needs on
a line of its own, ``--@include lib/<file>.lua``, where that file's text goes.
Nothing else is rewritten: a script's text is exactly

    ``#!lua`` shebang line, :data:`ftlayer.scripting.lua_layout.LAYOUT`, a blank line, then the
    file with each include line replaced by the library file it names,

so the same files always give the same text and so the same SHA1 (the
``EVALSHA`` name a script is cached under on the server). Library files include
nothing themselves.

The ``#!lua`` shebang makes the server hold a script to the keys it declares (a
cluster refuses any other key; Redis >= 7.0 or Valkey needed).

The server reports an error inside a script at ``user_script:<line>`` of the text
it ran, which is in no file: :meth:`LuaSource.explain` adds the file and line
that text line came from (``lib/chunk.lua:17``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from ftlayer.scripting.lua_layout import LAYOUT

#: First line of every script (see the module notes).
SHEBANG = "#!lua\n"
#: What the loader reports as the file of the shebang and layout lines.
GENERATED = "<generated: ftlayer/scripting/lua_layout.py>"

_INCLUDE = re.compile(r"^--@include (lib/[a-z_]+\.lua)\s*$")
_USER_SCRIPT = re.compile(r"user_script:(\d+)")


@dataclass(frozen=True)
class Origin:
    """Where one line of a script's text comes from: a file under ``ftlayer/lua/`` and its line
    (1-based), and for a library line the include line that brought it in."""

    file: str
    line: int
    included_at: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where}, included at {self.included_at}" if self.included_at else where


@dataclass(frozen=True)
class LuaSource:
    """One script as the server runs it: its text and, per line of it, where that line comes from."""

    name: str
    file: str
    text: str
    origins: tuple[Origin, ...]

    @functools.cached_property
    def sha(self) -> str:
        """SHA1 of the text: the name ``EVALSHA`` runs it by."""
        return hashlib.sha1(self.text.encode()).hexdigest()

    def origin(self, line: int) -> Origin | None:
        """The file and line of line ``line`` (1-based) of the text, or None if there is no such line."""
        return self.origins[line - 1] if 1 <= line <= len(self.origins) else None

    def explain(self, message: str) -> str:
        """``message`` (a server error) with each ``user_script:N`` followed by the file and line it is:
        ``user_script:120 [lib/chunk.lua:17, included at flush.lua:12]``."""

        def where(m: re.Match[str]) -> str:
            found = self.origin(int(m.group(1)))
            return m.group(0) if found is None else f"{m.group(0)} [{found}]"

        return _USER_SCRIPT.sub(where, message)


def _read(path: str) -> str:
    return (resources.files("ftlayer") / "lua" / path).read_text(encoding="utf-8")


def _expand(path: str) -> list[tuple[str, Origin]]:
    """The lines of a script file with its include lines replaced by the library files they name."""
    out: list[tuple[str, Origin]] = []
    for n, line in enumerate(_read(path).split("\n")[:-1], 1):
        found = _INCLUDE.match(line)
        if found is None:
            out.append((line, Origin(path, n)))
            continue
        for k, lib_line in enumerate(_read(found.group(1)).split("\n")[:-1], 1):
            if _INCLUDE.match(lib_line):
                msg = f"{found.group(1)}:{k}: a library file includes nothing (included from {path}:{n})"
                raise ValueError(msg)
            out.append((lib_line, Origin(found.group(1), k, f"{path}:{n}")))
    return out


def script_names() -> tuple[str, ...]:
    """Every script: the upper-cased stem of each ``.lua`` file directly under ``ftlayer/lua/``, sorted."""
    folder = resources.files("ftlayer") / "lua"
    return tuple(sorted(p.name[:-4].upper() for p in folder.iterdir() if p.name.endswith(".lua")))


@functools.cache
def load(name: str) -> LuaSource:
    """The script ``name`` (``"FLUSH"``: file ``flush.lua``) as the server runs it.

    Raises ``KeyError`` for a name that is no script file.
    """
    if name not in script_names():
        raise KeyError(name)
    file = f"{name.lower()}.lua"
    head = SHEBANG + LAYOUT + "\n"
    lines = [(text, Origin(GENERATED, n)) for n, text in enumerate(head.split("\n")[:-1], 1)]
    lines += _expand(file)
    text = "".join(line + "\n" for line, _ in lines)
    return LuaSource(name, file, text, tuple(origin for _, origin in lines))

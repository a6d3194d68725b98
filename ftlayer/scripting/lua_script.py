"""What a server-side script takes: its KEYS and ARGV, declared once, next to its caller.

Each caller module declares the scripts it runs, for example (``ftlayer.acker.rotating_map``)::

    LEASE = LuaScript("LEASE", keys=("lease",), argv=("owner", "ttl_ms"))

and runs them through ``SourceStore.run(LEASE, keys, args)``, which calls
:meth:`LuaScript.check` first: a call whose KEYS or ARGV do not fit the
declaration raises :class:`~ftlayer.errors.ScriptCallError` naming the script and
the key or argument, and nothing is sent. The script's file
(``ftlayer/lua/lease.lua``) states the same declaration in its heading comment,
``-- KEYS: lease`` and ``-- ARGV: owner, ttl_ms``, and
``tests/ftlayer/scripting/test_script_declarations.py`` holds every file to its declaration
(and to the KEYS and ARGV positions its Lua reads).

A KEYS entry names the key by its suffix after the source's ``{tag}:`` (see
``ftlayer.keyspace.keys``), which the check compares with the key passed:

- ``ck``: one key, whose suffix is ``ck``; ``tok:*``: one key whose suffix starts with ``tok:``;
- ``ch:*[num_channels]``: as many such keys as the ARGV entry ``num_channels`` says;
- ``ch:*...``: every key left (zero or more), only last;
- ``rpl?``: one key or none, only at the end (with nothing but other optional ones after it).

An ARGV entry is a name, ``name[count]`` (as many values as the ARGV entry ``count``
says) or ``name?`` (an optional trailing value). ARGV values are not type-checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from ftlayer.errors import ScriptCallError
from ftlayer.scripting import lua_source

#: KEYS[1..11] of every script that changes record state, bound to ``K_CK`` .. ``K_BKT`` by
#: ``ftlayer/lua/lib/keys.lua`` (``SourceStore.state_keys`` gives them in this order).
STATE_KEYS = ("ck", "ci", "cf", "xv", "live", "gen", "bcnt", "failed", "due", "stats", "bkt")

_ENTRY = re.compile(r"^([a-z_]+(?::\*)?)(\?|\.\.\.|\[([a-z_]+)\])?$")
_declared: dict[str, LuaScript] = {}


@dataclass(frozen=True)
class _Entry:
    name: str  # as declared: "ck", "tok:*", "ch:*[num_channels]", "rpl?"
    base: str  # without the marker: "ck", "tok:*"
    kind: str  # "one", "opt", "count" or "rest"
    count: str = ""  # the ARGV entry giving the count (kind "count")
    family: str = ""  # "tok:" for "tok:*" (any key of that family); "" for one named key

    def matches(self, key: str) -> bool:
        suffix = key[key.rfind("}:") + 2:]  # a key without a hash tag: the whole key
        if self.family:
            return suffix.startswith(self.family)
        return suffix == self.base


def _parse(script: str, what: str, names: Sequence[str]) -> tuple[_Entry, ...]:
    out: list[_Entry] = []
    for i, name in enumerate(names):
        found = _ENTRY.match(name)
        if found is None or (what == "ARGV" and ":" in name):
            msg = f"{script}: {what} entry {name!r} is not of the form name, name:*, name[count], name... or name?"
            raise ValueError(msg)
        marker = found.group(2) or ""
        kind = {"": "one", "?": "opt", "...": "rest"}.get(marker, "count")
        later = names[i + 1:]
        if kind == "rest" and later:
            msg = f"{script}: {what} entry {name!r} takes every value left, so it must come last"
            raise ValueError(msg)
        if kind == "opt" and not all(n.endswith("?") for n in later):
            msg = f"{script}: optional {what} entry {name!r} may only be followed by optional ones"
            raise ValueError(msg)
        base = found.group(1)
        out.append(_Entry(name, base, kind, found.group(3) or "", base[:-1] if base.endswith(":*") else ""))
    return tuple(out)


class LuaScript:
    """The declaration of one script of ``ftlayer/lua/``: its name (``"FLUSH"`` runs ``flush.lua``),
    its KEYS and its ARGV (see the module notes). One declaration per script in the process."""

    def __init__(self, name: str, *, keys: Sequence[str], argv: Sequence[str]) -> None:
        if name in _declared:
            msg = f"script {name} is declared twice"
            raise ValueError(msg)
        self.name = name
        self.source = lua_source.load(name)  # KeyError if there is no such file
        self.keys = tuple(keys)
        self.argv = tuple(argv)
        self._keys = _parse(name, "KEYS", self.keys)
        self._argv = _parse(name, "ARGV", self.argv)
        counts = {e.count for e in (*self._keys, *self._argv) if e.kind == "count"}
        fixed = {e.base for e in self._argv if e.kind == "one"}
        if not counts <= fixed:
            msg = f"{name}: the counts {sorted(counts - fixed)} are no required ARGV entry"
            raise ValueError(msg)
        _declared[name] = self

    def __repr__(self) -> str:
        return f"LuaScript({self.name!r}, keys={self.keys!r}, argv={self.argv!r})"

    def check(self, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Raise :class:`ScriptCallError` unless ``keys`` and ``args`` fit the declaration."""
        values: dict[str, Any] = {}
        at = 0
        for e in self._argv:
            if e.kind == "opt" and at >= len(args):
                break
            if e.kind == "count":
                at += self._count(e, values, "ARGV")
                if at > len(args):
                    self._fail(f"ARGV {e.name} needs {at - len(args)} more value(s) than the {len(args)} given")
                continue
            if at >= len(args):
                self._fail(f"ARGV[{at + 1}] ({e.name}) is missing: {len(args)} given")
            values[e.base] = args[at]
            at += 1
        if at != len(args):
            self._fail(f"takes {at} ARGV for these counts, {len(args)} given")
        at = 0
        for e in self._keys:
            if e.kind in ("one", "opt"):
                if at >= len(keys):
                    if e.kind == "opt":
                        break
                    self._fail(f"KEYS[{at + 1}] ({e.name}) is missing: {len(keys)} given")
                n = 1
            else:
                n = len(keys) - at if e.kind == "rest" else self._count(e, values, "KEYS")
                if at + n > len(keys):
                    self._fail(f"KEYS {e.name} needs {at + n - len(keys)} more key(s) than the {len(keys)} given")
            for j in range(at, at + n):
                if not e.matches(keys[j]):
                    self._fail(f"KEYS[{j + 1}] should be the source's {e.base} key ({e.name}), got {keys[j]!r}")
            at += n
        if at != len(keys):
            self._fail(f"takes {at} KEYS for these ARGV, {len(keys)} given (first extra: {keys[at]!r})")

    def _count(self, e: _Entry, values: dict[str, Any], what: str) -> int:
        try:
            n = int(values[e.count])
        except (KeyError, TypeError, ValueError):
            self._fail(f"{what} {e.name}: ARGV {e.count} = {values.get(e.count)!r} is no count")
        if n < 0:
            self._fail(f"{what} {e.name}: ARGV {e.count} = {n} is no count")
        return n

    def _fail(self, why: str) -> NoReturn:
        msg = f"script {self.name} (ftlayer/lua/{self.source.file}) called with wrong KEYS or ARGV: {why}"
        raise ScriptCallError(msg)


def declared() -> dict[str, LuaScript]:
    """Every script declared so far (a module declares its scripts when it is imported)."""
    return dict(_declared)

"""Every key a script touches is one it declares in KEYS (a cluster node runs a script only
on its own slots, and redis-py routes it by its declared keys).

The server cannot check this for us: with the ``#!lua`` shebang a cluster node refuses a
key of another slot, but lets an undeclared key of the same hash tag through (measured on
valkey-server 9.1.2). So the scripts' source is checked: the key argument of every
``redis.call`` must be ``KEYS[...]`` or one of the ``K_*`` locals bound to KEYS, never a
name built from strings.
"""

from __future__ import annotations

import re

import pytest

from ftlayer.scripting import lua_source

CALL = re.compile(r"redis\.call\(\s*'([A-Z]+)'\s*,\s*([^,)]+)")
DECLARED = re.compile(r"^(KEYS\[[^\]]+\]|K_[A-Z]+)$")
K_BINDING = re.compile(r"\b(K_[A-Z]+)\b[^=\n]*=")


@pytest.mark.parametrize("name", lua_source.script_names())
def test_every_redis_call_names_a_declared_key(name: str) -> None:
    body = lua_source.load(name).text
    assert body.startswith(lua_source.SHEBANG)
    calls = CALL.findall(body)
    assert calls, f"{name} calls nothing?"
    built = [f"{cmd} {arg.strip()}" for cmd, arg in calls if not DECLARED.match(arg.strip())]
    assert not built, f"{name} touches keys it does not declare: {built}"


def test_the_k_locals_are_bound_to_keys_only() -> None:
    for line in lua_source.load("PERSIST").text.splitlines():
        if K_BINDING.search(line) and line.lstrip().startswith("local K_"):
            rhs = line.split("=", 1)[1]
            assert all(part.strip().startswith("KEYS[") for part in rhs.split(",")), line


def test_the_check_catches_a_built_key_name() -> None:
    body = "#!lua\nredis.call('XADD', PREFIX .. 'ch:' .. ch, '*', 'i', x)\n"
    calls = CALL.findall(body)
    assert [arg for _, arg in calls if not DECLARED.match(arg.strip())] == ["PREFIX .. 'ch:' .. ch"]

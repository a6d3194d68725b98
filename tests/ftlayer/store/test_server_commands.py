"""ftlayer.store.server_commands lists every command ftlayer's scripts call (what ``ftlayer doctor`` probes)."""

from __future__ import annotations

import re
from pathlib import Path

import redis

from ftlayer.store.server_commands import COMMANDS, PROBE_KEY, probe_permissions

LUA = Path(__file__).resolve().parents[3] / "ftlayer" / "lua"


def test_every_command_a_script_calls_is_probed() -> None:
    called = {m.upper() for path in LUA.rglob("*.lua")
              for m in re.findall(r"redis\.p?call\(\s*['\"]([A-Za-z]+)", path.read_text())}
    assert len(called) > 20
    assert called - {u.argv[0] for u in COMMANDS} == set()


def test_a_probe_runs_nothing(redis_client: redis.Redis, namespace: str) -> None:
    assert set(probe_permissions(redis_client, namespace).values()) == {None}  # the default user may run all
    assert redis_client.exists(PROBE_KEY.format(namespace=namespace)) == 0  # XADD, SET, ... were discarded
    assert redis_client.ping()  # the connection went back to the pool outside MULTI

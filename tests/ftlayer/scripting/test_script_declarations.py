"""Each script's KEYS and ARGV are declared once, next to its caller (``ftlayer.scripting.lua_script``): its
file states the same, its Lua reads no position the declaration does not have, and a call that
does not fit is refused before anything is sent, naming the script and the key."""

from __future__ import annotations

import re

import pytest

import ftlayer.facade.ft_layer  # noqa: F401  (imports every module that declares a script)
from ftlayer.acker.persistence import PERSIST, READ_CHANNEL
from ftlayer.acker.replayer import REPLAY
from ftlayer.acker.rotating_map import EXPIRE, ROTATE
from ftlayer.errors import ScriptCallError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.scripting import lua_source
from ftlayer.scripting.lua_script import LuaScript, declared

_LITERAL = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")


def _stated(name: str, what: str) -> str:
    """The declaration a script's heading comment states: ``-- KEYS: a, b,`` and its continuation
    lines (a line ending in a comma goes on on the next)."""
    lines = lua_source.load(name).text.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith(f"-- {what}: "))
    text = lines[at][len(f"-- {what}: "):]
    while text.endswith(","):
        at += 1
        text += " " + lines[at].removeprefix("--").strip()
    return text


def _positional(entries: tuple[str, ...]) -> int:
    """How many leading entries sit at fixed positions (before the first counted or rest entry)."""
    n = 0
    for e in entries:
        if e.endswith("]") or e.endswith("..."):
            break
        n += 1
    return n


def test_every_script_file_is_declared_once() -> None:
    assert sorted(declared()) == sorted(lua_source.script_names())


@pytest.mark.parametrize("name", lua_source.script_names())
def test_the_file_states_the_declared_keys_and_argv(name: str) -> None:
    script = declared()[name]
    assert _stated(name, "KEYS") == ", ".join(script.keys)
    assert _stated(name, "ARGV") == (", ".join(script.argv) or "(none)")
    lines = script.source.text.split("\n")
    first = next(i for i, o in enumerate(script.source.origins) if o.file == script.source.file)
    heading = []
    for line in lines[first:]:
        if not line.startswith("--"):
            break
        heading.append(line)
    assert heading[0].startswith(f"-- {name.lower()}: "), heading[0]
    assert any(line.startswith("-- Returns: ") for line in heading), f"{script.source.file} states no reply"
    for what in ("KEYS", "ARGV"):
        assert any(line.startswith(f"-- {what}: ") for line in heading), f"{script.source.file} states no {what}"


@pytest.mark.parametrize("name", lua_source.script_names())
def test_the_lua_reads_no_position_the_declaration_lacks(name: str) -> None:
    script = declared()[name]
    bound = {"KEYS": _positional(script.keys), "ARGV": _positional(script.argv)}
    read = [(what, int(n)) for what, n in _LITERAL.findall(script.source.text)]
    beyond = [f"{what}[{n}]" for what, n in read if n > bound[what]]
    assert not beyond, f"{name} reads {beyond}, past the {bound} positions its declaration fixes"


def test_a_script_is_declared_once() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        LuaScript("ROTATE", keys=("gen",), argv=())


def test_a_declaration_names_an_existing_file_and_well_formed_entries() -> None:
    with pytest.raises(KeyError):
        LuaScript("NO_SUCH_SCRIPT", keys=(), argv=())
    assert "NO_SUCH_SCRIPT" not in declared()


def test_a_call_that_fits_passes(layer: FTLayer) -> None:
    store, k = layer.store, layer.store.keys
    ROTATE.check([k.gen, k.lease, k.expq, k.bcnt], ["", 6, "", ""])
    PERSIST.check([*store.state_keys, k.token("p:x"), *store.channel_keys(2)], [k.prefix, 2, b"", 1000])
    READ_CHANNEL.check([k.channel(0), k.chunks, k.chunk_frames, k.read_marks],
                       ["-", 0, "+", 1, 2, 3, 4, 0, 5])  # without the optional hold set and chunk bounds
    READ_CHANNEL.check([k.channel(0), k.chunks, k.chunk_frames, k.read_marks, k.held("b")],
                       ["-", 0, "+", 1, 2, 3, 4, 0, 5, b"", b""])
    EXPIRE.check([*store.state_keys, k.expq, k.read_marks, k.holds, k.held("a"), k.held("b"), *store.channel_keys(3)],
                 [k.prefix, 1, 2, 3, 4, 5, 6, 7, 2, "a", "b"])
    REPLAY.check([*store.state_keys, k.dlq, *store.channel_keys(2), k.replaced],
                 [k.prefix, 2, b"", b"", b"", 1, 2, b""])


def test_a_key_out_of_place_is_refused_naming_the_script_and_the_key(layer: FTLayer) -> None:
    k = layer.store.keys
    with pytest.raises(ScriptCallError, match=r"ROTATE .*rotate\.lua.*KEYS\[2\] should be the source's lease key"):
        layer.store.run(ROTATE, [k.gen, k.expq, k.lease, k.bcnt], ["", 6, "", ""])
    assert layer.buckets.current_gen() == 0  # nothing was sent


def test_a_missing_or_extra_key_or_argument_is_refused(layer: FTLayer) -> None:
    store, k = layer.store, layer.store.keys
    with pytest.raises(ScriptCallError, match=r"ROTATE .*takes 4 KEYS for these ARGV, 5 given"):
        ROTATE.check([k.gen, k.lease, k.expq, k.bcnt, k.gen], ["", 6, "", ""])
    with pytest.raises(ScriptCallError, match=r"ROTATE .*KEYS\[4\] \(bcnt\) is missing: 3 given"):
        ROTATE.check([k.gen, k.lease, k.expq], ["", 6, "", ""])
    with pytest.raises(ScriptCallError, match=r"ROTATE .*ARGV\[4\] \(target_gen\) is missing"):
        ROTATE.check([k.gen, k.lease, k.expq, k.bcnt], ["", 6, ""])
    with pytest.raises(ScriptCallError, match=r"KEYS ch:\*\[num_channels\] needs 1 more key"):
        PERSIST.check([*store.state_keys, k.token("p:x"), *store.channel_keys(2)], [k.prefix, 3, b"", 1000])
    with pytest.raises(ScriptCallError, match=r"KEYS\[13\] should be the source's ch:\* key"):
        PERSIST.check([*store.state_keys, k.token("p:x"), k.dlq], [k.prefix, 1, b"", 1000])
    with pytest.raises(ScriptCallError, match=r"KEYS\[1\] should be the source's ck key"):
        PERSIST.check([k.chunk_acks, *store.state_keys[1:], k.token("p:x")], [k.prefix, 0, b"", 1000])
    with pytest.raises(ScriptCallError, match=r"ARGV num_channels = 'two' is no count"):
        PERSIST.check([*store.state_keys, k.token("p:x")], [k.prefix, "two", b"", 1000])
    with pytest.raises(ScriptCallError, match=r"EXPIRE .*KEYS\[15\] should be the source's hld:\* key"):
        EXPIRE.check([*store.state_keys, k.expq, k.read_marks, k.holds, *store.channel_keys(1)],
                     [k.prefix, 1, 2, 3, 4, 5, 6, 7, 1, "a"])  # a hold tag without its set
    with pytest.raises(ScriptCallError, match=r"REPLAY .*takes 15 KEYS for these ARGV, 16 given"):
        REPLAY.check([*store.state_keys, k.dlq, *store.channel_keys(2), k.replaced, k.replaced],
                     [k.prefix, 2, b"", b"", b"", 1])

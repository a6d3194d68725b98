"""The scripts come from the .lua files under ftlayer/lua/, and a server error names the file and line."""

from __future__ import annotations

import struct
from importlib import resources

import pytest

from ftlayer.acker.acker_table import FLUSH
from ftlayer.acker.rotating_map import ROTATE
from ftlayer.errors import AckerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.scripting import lua_source
from serialization.serializers import make_record


def _file_lines(path: str) -> list[str]:
    return (resources.files("ftlayer") / "lua" / path).read_text().split("\n")


def _line_of(path: str, text: str) -> int:
    """The 1-based line of ``path`` holding ``text`` (exactly one does)."""
    found = [n for n, line in enumerate(_file_lines(path), 1) if text in line]
    assert len(found) == 1, (path, text, found)
    return found[0]


@pytest.mark.parametrize("name", lua_source.script_names())
def test_each_line_of_a_script_maps_to_the_line_of_the_file_it_came_from(name: str) -> None:
    source = lua_source.load(name)
    lines = source.text.split("\n")[:-1]
    assert len(lines) == len(source.origins)
    files = 0
    for n, (line, origin) in enumerate(zip(lines, source.origins, strict=True), 1):
        assert source.origin(n) == origin
        if origin.file == lua_source.GENERATED:
            continue
        files += 1
        assert _file_lines(origin.file)[origin.line - 1] == line, f"{name} line {n} is not {origin}"
        assert origin.file == source.file or origin.file.startswith("lib/")
    assert files > 0
    assert source.origin(0) is None and source.origin(len(lines) + 1) is None


def test_every_script_file_is_a_script_and_the_library_is_not() -> None:
    folder = resources.files("ftlayer") / "lua"
    files = sorted(p.name for p in folder.iterdir() if p.name.endswith(".lua"))
    assert [f"{n.lower()}.lua" for n in lua_source.script_names()] == files
    assert "FLUSH" in lua_source.script_names()
    with pytest.raises(KeyError):
        lua_source.load("CHUNK")  # lib/chunk.lua is no script


def test_the_same_files_give_the_same_text_and_sha() -> None:
    a = lua_source.load("EXPIRE")
    lua_source.load.cache_clear()
    b = lua_source.load("EXPIRE")
    assert a is not b
    assert (a.text, a.sha) == (b.text, b.sha)


def test_a_server_error_in_a_script_names_its_file_and_line(layer: FTLayer) -> None:
    store = layer.store
    k = store.keys
    with pytest.raises(AckerError) as err:  # num_buckets 'x': the server's arithmetic on nil
        store.run(ROTATE, [k.gen, k.lease, k.expq, k.bcnt], ["", "x", "", ""])
    line = _line_of("rotate.lua", "for e = math.max(0, g + 1 - n)")
    message = str(err.value)
    assert "arithmetic" in message and "user_script:" in message
    assert f"[rotate.lua:{line}]" in message, message


def test_a_server_error_in_a_library_file_names_that_file_its_line_and_the_include(layer: FTLayer) -> None:
    rec = make_record(layer, 1, key="k1")
    layer.persist([rec])
    store = layer.store
    sid = rec.record_id.source_record_id
    fails = struct.pack(">qH", sid, 4) + b"boom"
    args = [store.keys.prefix, "0", 60_000, b"", fails, store.now_ms(), "x", 2, 60_000, "-", "0"]
    with pytest.raises(AckerError) as err:  # backoff initial 'x': chunk_fail's arithmetic on nil
        store.run(FLUSH, [*store.state_keys, store.keys.token("-")], args)
    line = _line_of("lib/chunk.lua", "local delay = b_init * ")
    include = _line_of("flush.lua", "--@include lib/chunk.lua")
    message = str(err.value)
    assert "FLUSH failed" in message and "arithmetic" in message
    assert f"[lib/chunk.lua:{line}, included at flush.lua:{include}]" in message, message
    assert layer.pending_count() == 1  # the script stopped before it wrote anything

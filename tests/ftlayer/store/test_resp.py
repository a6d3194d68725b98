"""ftlayer.store.resp.pack_command: the same bytes as redis-py's packers, a large argument sent as is."""

from __future__ import annotations

from typing import Any

import hiredis
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.connection import Encoder, PythonRespSerializer

from ftlayer.store import resp
from ftlayer.store.resp import BIG_ARG_BYTES, pack_command
from ftlayer.store.source_store import evalsha

ENCODE = Encoder("utf-8", "strict", False).encode
ARG = st.one_of(st.text(max_size=40), st.integers(min_value=-(2**63), max_value=2**63 - 1),
                st.binary(max_size=64), st.floats(allow_nan=False, allow_infinity=False))


def _redis_py(args: tuple[Any, ...]) -> bytes:
    return b"".join(PythonRespSerializer(6000, ENCODE).pack(*args))


@settings(max_examples=300, deadline=None)
@given(st.lists(ARG, max_size=12), st.integers(min_value=1, max_value=64))
def test_the_bytes_are_redis_pys_whatever_is_cut_out(tail: list[Any], big: int) -> None:
    args = ("EVALSHA", *tail)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(resp, "BIG_ARG_BYTES", big)  # cut small arguments out too
        got = pack_command(args, ENCODE)
    assert b"".join(got) == _redis_py(args) == hiredis.pack_command(tuple(ENCODE(a) for a in args))


@pytest.mark.parametrize("size", [BIG_ARG_BYTES - 1, BIG_ARG_BYTES, 3 << 20])
def test_an_argument_at_or_above_the_cut_is_its_own_buffer_not_a_copy(size: int) -> None:
    big = b"x" * size
    got = pack_command(("EVALSHA", "0" * 40, 1, "k", "p", 2, big, 60_000), ENCODE)
    assert b"".join(got) == _redis_py(("EVALSHA", "0" * 40, 1, "k", "p", 2, big, 60_000))
    if size >= BIG_ARG_BYTES:
        assert len(got) == 3 and got[1] is big  # framing, the argument itself, framing
    else:
        assert len(got) == 1  # joined with the rest


def test_evalsha_hands_a_large_argument_to_the_server_intact(redis_server_url: str) -> None:
    client = redis.Redis.from_url(redis_server_url)
    script = client.register_script("return {ARGV[1], ARGV[2], ARGV[3], #ARGV}")
    big = bytes(range(256)) * ((2 << 20) // 256) + b"\r\n$-1\r\n"  # framing bytes inside the data
    assert evalsha(client, script, [], [b"a", big, "é" * 3]) == [b"a", big, "é".encode() * 3, 3]
    assert evalsha(client, script, [], [big, big, 7]) == [big, big, b"7", 3]


@pytest.mark.parametrize(("args", "big"), [
    ((), False), (("a" * BIG_ARG_BYTES, 7), False),  # text is not cut out: ftlayer's large arguments are bytes
    ((b"x" * (BIG_ARG_BYTES - 1),), False), ((1, b"x" * BIG_ARG_BYTES), True),
    ((bytearray(BIG_ARG_BYTES),), True), ((memoryview(b"x" * BIG_ARG_BYTES),), True),
])
def test_a_command_is_worth_cutting_only_with_a_large_bytes_argument(args: tuple[Any, ...], big: bool) -> None:
    from ftlayer.store.resp import carries_big_arg

    assert carries_big_arg(args) is big


def test_evalsha_cuts_only_a_command_that_carries_a_large_argument(
        redis_server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ftlayer.store import source_store

    cut: list[int] = []
    real = source_store.pack_command

    def counting(args: Any, encode: Any) -> list[Any]:
        cut.append(len(args))
        return real(args, encode)

    monkeypatch.setattr(source_store, "pack_command", counting)
    client = redis.Redis.from_url(redis_server_url)
    script = client.register_script("return #ARGV[1]")
    assert evalsha(client, script, [], [b"x" * 10]) == 10
    assert cut == []  # a small command: redis-py's own packer
    assert evalsha(client, script, [], [b"x" * BIG_ARG_BYTES]) == BIG_ARG_BYTES
    assert cut == [4]

"""msgspec's columns are msgpack's columns, or it steps aside (None): never a different value."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from itertools import repeat
from typing import Any

import msgpack
from hypothesis import example, given, settings
from hypothesis import strategies as st

from serialization.payload import SerializationError, pack_payload, unpack_run
from serialization.payload_columns_fast import unpack_run_columns

NAMES = ["i", "user", "class"]  # "class": any str may be a key


def _msgpack_columns(data: bytes, count: int, names: list[str]) -> list[list[Any]] | None:
    """What the msgpack path gathers (runtime.spark.payload_columns), None where it leaves the bulk path."""
    try:
        values = unpack_run(data, count)
    except SerializationError:
        return None
    if set(map(type, values)) != {dict}:
        return None
    return [list(map(dict.get, values, repeat(n))) for n in names]


def _same(a: list[list[Any]], b: list[list[Any]]) -> bool:
    # by type and value (1 == 1.0 == True in Python, not here)
    return [[(type(v), v) for v in c] for c in a] == [[(type(v), v) for v in c] for c in b]


def test_plain_records_take_the_fast_path() -> None:
    values = [{"i": i, "user": f"user-{i % 97}", "class": None} for i in range(1000)] + [{}, {"i": 2**64 - 1}]
    data = b"".join(map(pack_payload, values))
    got = unpack_run_columns(data, len(values), NAMES)
    assert got is not None
    expected = _msgpack_columns(data, len(values), NAMES)
    assert expected is not None and _same(got, expected)


_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=5),
    st.binary(max_size=3), st.decimals(allow_nan=False, places=3), st.uuids(), st.dates(), st.times(),
    st.timedeltas(), st.datetimes(), st.datetimes(timezones=st.just(dt.timezone(dt.timedelta(hours=2)))),
)
_cells = st.one_of(_scalars, st.tuples(_scalars), st.lists(_scalars, max_size=2),
                   st.dictionaries(st.text(max_size=2), _scalars, max_size=2))
_keys = st.sampled_from(["i", "user", "class", "extra"])
_payloads = st.one_of(
    st.dictionaries(_keys, _cells, max_size=4).map(pack_payload),
    _cells.map(pack_payload),  # not a dict
    # what other producers may write: msgpack's own timestamp (ext -1, nanoseconds), array keys,
    # a repeated key, an unknown ext, invalid UTF-8
    st.builds(lambda s, ns: msgpack.packb({"i": msgpack.Timestamp(s, ns)}),
              st.integers(-(2**34), 2**34), st.integers(0, 999_999_999)),
    st.just(b"\x81\xa1i\x81\x91\x01\x02"),  # {"i": {[1]: 2}}
    st.just(b"\x82\xa1i\x01\xa1i\x02"),  # {"i": 1, "i": 2}
    st.just(msgpack.packb({"i": msgpack.ExtType(42, b"x")})),
    st.just(b"\x81\xa1i\xa1\xff"),
    # UTF-8 edge cases: a lone surrogate, an overlong NUL, beyond U+10FFFF (refused), U+FFFF (allowed)
    st.sampled_from([b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xef\xbf\xbf"]).map(
        lambda s: b"\x81\xa1i" + bytes([0xA0 | len(s)]) + s),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_payloads, min_size=1, max_size=8))
@example([msgpack.packb({"i": msgpack.Timestamp(0, 999)})])  # msgspec rounds to 1 us, msgpack truncates
@example([msgpack.packb({"i": msgpack.Timestamp(0, 999)}), msgpack.packb({"i": msgpack.Timestamp(0, 0)})])
@example([b"\x82\xa1i" + pack_payload(dt.datetime(2020, 1, 1)) + b"\xa1i" + msgpack.packb(msgpack.Timestamp(0, 999))])
@example([b"\x81\xa1i\x81\x91\x01\x02"])
@example([pack_payload({"i": (1, [2])})])
@example([pack_payload({"i": decimal.Decimal("1.5"), "user": uuid.UUID(int=5)})])
def test_fast_columns_are_msgpacks_or_none(payloads: list[bytes]) -> None:
    data = b"".join(payloads)
    got = unpack_run_columns(data, len(payloads), NAMES)
    expected = _msgpack_columns(data, len(payloads), NAMES)
    if got is not None:
        assert expected is not None and _same(got, expected)


def test_what_msgspec_reads_its_own_way_is_left_to_msgpack() -> None:
    for payload in (msgpack.packb({"i": msgpack.Timestamp(0, 999)}), b"\x81\xa1i\x81\x91\x01\x02",
                    pack_payload({"i": [1]}), pack_payload({"extra": 1}), pack_payload({1: 2}), pack_payload("s")):
        assert unpack_run_columns(payload, 1, NAMES) is None, payload
    assert unpack_run_columns(b"", 0, NAMES) is None
    assert unpack_run_columns(pack_payload({"i": 1}), 1, ["i", "i"]) is None  # two fields of one name

"""The msgpack payload codec: record values to bytes and back, exactly.

``pack_payload`` / ``unpack_payload`` round-trip these *exact* types (subclasses
are refused, so nothing comes back as a different type than it went in):
``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``, ``dict``
and the ext types below. ``bytearray`` and ``memoryview`` are packed as
``bytes`` and come back as ``bytes``. Dict keys may be any supported hashable
value (int, tuple, ...), not only ``str``.

Ext codes (msgpack ext type number, then the ext's data; integers big-endian):

=====  ======================  =================================================
code   Python type             ext data
=====  ======================  =================================================
1      ``int`` beyond 64 bits  ASCII decimal text, e.g. ``b"-18446744073709551617"``;
                               at most ``MAX_INT_DIGITS`` digits (ints that fit
                               signed or unsigned 64 bits are native msgpack ints)
2      ``tuple``               a msgpack array of the elements (packed recursively)
3      naive ``datetime``      ``>HBBBBBIB``: year, month, day, hour, minute,
                               second, microsecond, fold (12 bytes)
4      aware ``datetime``      code 3's 12 bytes, then ``>q`` utcoffset in
                               microseconds (20 bytes)
5      ``date``                ``>HBB``: year, month, day
6      naive ``time``          ``>BBBIB``: hour, minute, second, microsecond, fold
7      ``timedelta``           ``>iii``: days, seconds, microseconds
8      ``Decimal``             ASCII ``str(value)`` (keeps sign, exponent, NaN, Inf)
9      ``UUID``                the 16 bytes of ``value.bytes``
-1     (read only)             msgpack's standard timestamp, written by other
                               producers; decoded as an aware UTC ``datetime``
=====  ======================  =================================================

An aware ``datetime`` comes back with a fixed-offset ``datetime.timezone`` of
the same ``utcoffset()``: it is the same instant and the same wall-clock time,
but zone *names* and rules (``ZoneInfo("Europe/Paris")``) are not kept. (Per
PEP 495 such a value compares unequal to the original when the original sits in
a fold of a zone whose offset depends on ``fold``; compare ``timestamp()`` then.)
A ``time`` with a ``tzinfo`` is refused: its offset is undefined without a date.

Bounds: a payload is at most ``MAX_PAYLOAD_BYTES``; tuples nest at most
``MAX_TUPLE_DEPTH`` deep inside each other, other nesting at most msgpack's own
limits (511 levels when packing); beyond them ``SerializationError`` is raised.
``unpack_payload`` lets msgpack size every string, array and map by the input
length, so a small input cannot make it allocate much more than its own size,
and it never loops: it either returns a value of the supported types or raises
``SerializationError``.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import struct
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from ftlayer.errors import SerializationError, UnsupportedTypeError
from ftlayer.records.record import MAX_PAYLOAD_BYTES

__all__ = [
    "EXT_AWARE_DATETIME",
    "EXT_BIGINT",
    "EXT_DATE",
    "EXT_DECIMAL",
    "EXT_NAIVE_DATETIME",
    "EXT_TIME",
    "EXT_TIMEDELTA",
    "EXT_TUPLE",
    "EXT_UUID",
    "MAX_INT_DIGITS",
    "MAX_PAYLOAD_BYTES",
    "MAX_TUPLE_DEPTH",
    "pack_payload",
    "pack_payloads",
    "unpack_many",
    "unpack_payload",
    "unpack_run",
]

EXT_BIGINT = 1
EXT_TUPLE = 2
EXT_NAIVE_DATETIME = 3
EXT_AWARE_DATETIME = 4
EXT_DATE = 5
EXT_TIME = 6
EXT_TIMEDELTA = 7
EXT_DECIMAL = 8
EXT_UUID = 9

# CPython's default int<->str digit limit: decimal conversion is superlinear, so
# a fixed bound keeps decoding cheap and makes every process agree on it.
MAX_INT_DIGITS = 4300
# Tuples nested in tuples (lists and dicts between them do not count).
MAX_TUPLE_DEPTH = 32

_SUPPORTED = (
    "None, bool, int, float, str, bytes, list, dict, tuple, datetime.datetime, "
    "datetime.date, datetime.time, datetime.timedelta, decimal.Decimal and uuid.UUID"
)

_DATETIME = struct.Struct(">HBBBBBIB")
_DATETIME_TZ = struct.Struct(">HBBBBBIBq")
_DATE = struct.Struct(">HBB")
_TIME = struct.Struct(">BBBIB")
_TIMEDELTA = struct.Struct(">iii")

_ExtType = msgpack.ExtType
# ExtType's own __new__ re-validates code and data in Python, which costs more
# than the packing itself; our codes and data are valid by construction.
_new_ext = tuple.__new__
_packb = msgpack.packb
_unpackb = msgpack.unpackb


# --- packing -------------------------------------------------------------------


def _unsupported(obj: object) -> UnsupportedTypeError:
    cls = type(obj)
    hint = ""
    for base in (
        tuple, list, dict, int, float, str, bytes, _dt.datetime, _dt.date, _dt.timedelta,
        decimal.Decimal, uuid.UUID,
    ):
        if isinstance(obj, base):
            hint = f"; it subclasses {base.__name__!r}, convert it to a plain {base.__name__}"
            break
    msg = (
        f"cannot serialize a value of type {cls.__qualname__!r} (module {cls.__module__}): "
        f"the payload codec carries only {_SUPPORTED}{hint}"
    )
    return UnsupportedTypeError(msg)


def _enc_bigint(value: int) -> msgpack.ExtType:
    text = str(value)  # ValueError beyond the interpreter's digit limit
    if len(text) - (text[0] == "-") > MAX_INT_DIGITS:
        msg = f"cannot serialize an int of {len(text)} digits: the limit is {MAX_INT_DIGITS}"
        raise SerializationError(msg)
    return _new_ext(_ExtType, (EXT_BIGINT, text.encode("ascii")))


def _enc_datetime(value: _dt.datetime) -> msgpack.ExtType:
    offset = value.utcoffset()
    fields = (
        value.year, value.month, value.day, value.hour, value.minute, value.second,
        value.microsecond, value.fold,
    )
    if offset is None:
        return _new_ext(_ExtType, (EXT_NAIVE_DATETIME, _DATETIME.pack(*fields)))
    micros = (offset.days * 86_400 + offset.seconds) * 1_000_000 + offset.microseconds
    return _new_ext(_ExtType, (EXT_AWARE_DATETIME, _DATETIME_TZ.pack(*fields, micros)))


def _enc_date(value: _dt.date) -> msgpack.ExtType:
    return _new_ext(_ExtType, (EXT_DATE, _DATE.pack(value.year, value.month, value.day)))


def _enc_time(value: _dt.time) -> msgpack.ExtType:
    if value.tzinfo is not None:
        msg = (
            f"cannot serialize a datetime.time with tzinfo {value.tzinfo!r}: only naive times "
            "are supported (use a datetime to keep an offset)"
        )
        raise UnsupportedTypeError(msg)
    data = _TIME.pack(value.hour, value.minute, value.second, value.microsecond, value.fold)
    return _new_ext(_ExtType, (EXT_TIME, data))


def _enc_timedelta(value: _dt.timedelta) -> msgpack.ExtType:
    return _new_ext(_ExtType, (EXT_TIMEDELTA, _TIMEDELTA.pack(value.days, value.seconds, value.microseconds)))


def _enc_decimal(value: decimal.Decimal) -> msgpack.ExtType:
    return _new_ext(_ExtType, (EXT_DECIMAL, str(value).encode("ascii")))


def _enc_uuid(value: uuid.UUID) -> msgpack.ExtType:
    return _new_ext(_ExtType, (EXT_UUID, value.bytes))


# Keyed by exact type: msgpack runs with strict_types=True, so every value that is
# not an exact native type (and every int outside 64 bits) arrives in _default_at.
_ENCODERS: dict[type, Callable[[Any], msgpack.ExtType]] = {
    int: _enc_bigint,
    _dt.datetime: _enc_datetime,
    _dt.date: _enc_date,
    _dt.time: _enc_time,
    _dt.timedelta: _enc_timedelta,
    decimal.Decimal: _enc_decimal,
    uuid.UUID: _enc_uuid,
}


def _default_at(depth: int, obj: Any) -> msgpack.ExtType:
    if type(obj) is tuple:
        # A tuple's items are packed by a nested packb; depth counts those levels.
        if depth >= MAX_TUPLE_DEPTH:
            msg = f"cannot serialize tuples nested more than {MAX_TUPLE_DEPTH} deep"
            raise SerializationError(msg)
        return _new_ext(_ExtType, (EXT_TUPLE, _pack(list(obj), depth + 1, 512)))
    encoder = _ENCODERS.get(type(obj))
    if encoder is None:
        raise _unsupported(obj)
    return encoder(obj)


# One prebuilt hook per tuple depth, so the hot path creates no objects per call.
_DEFAULTS = [functools.partial(_default_at, d) for d in range(MAX_TUPLE_DEPTH + 1)]


def _pack(value: Any, depth: int = 0, buf_size: int = 256 * 1024) -> bytes:
    # A nested packb with msgpack's default 256 KiB buffer costs ~20 us in page
    # faults while the outer buffer is still held; tuples are small, so start small.
    data: bytes = _packb(
        value, default=_DEFAULTS[depth], use_bin_type=True, strict_types=True, buf_size=buf_size
    )
    return data


class _ThreadPackers(threading.local):
    """One top-level ``msgpack.Packer`` per thread, reused for every payload.

    Building a Packer (what ``packb`` does per call) costs about three times the
    packing of a small record. A Packer is not thread-safe, hence one per thread;
    it is not re-entered either: tuples (the only nested packing) go through
    :func:`_pack`. After an error msgpack empties the buffer, so the next value
    starts clean. Its buffer keeps the largest size it grew to, so a thread that
    packed a payload over ``_PACKER_KEEP_BYTES`` gets a fresh Packer.
    """

    def __init__(self) -> None:
        self.packer = self.fresh()

    @staticmethod
    def fresh() -> msgpack.Packer:
        return msgpack.Packer(default=_DEFAULTS[0], use_bin_type=True, strict_types=True, autoreset=True)


_PACKER_KEEP_BYTES = 1 << 20
_PACKERS = _ThreadPackers()


def pack_payload(value: Any) -> bytes:
    """Pack ``value`` into msgpack bytes that :func:`unpack_payload` turns back into it.

    Raises ``UnsupportedTypeError`` naming the type of the first value (at any depth)
    that the codec does not carry, and ``SerializationError`` for a supported type
    with an unencodable value (a ``str`` with lone surrogates, an int beyond
    ``MAX_INT_DIGITS`` digits, nesting too deep, a result over ``MAX_PAYLOAD_BYTES``).
    """
    try:
        data: bytes = _PACKERS.packer.pack(value)
    except SerializationError:
        raise
    except (TypeError, ValueError, ArithmeticError, BufferError, RecursionError) as exc:
        msg = f"cannot serialize a value of type {type(value).__qualname__!r}: {exc}"
        raise SerializationError(msg) from exc
    if len(data) > _PACKER_KEEP_BYTES:
        _PACKERS.packer = _PACKERS.fresh()  # do not hold the grown buffer
    if len(data) > MAX_PAYLOAD_BYTES:
        msg = f"payload of {len(data)} bytes exceeds MAX_PAYLOAD_BYTES ({MAX_PAYLOAD_BYTES})"
        raise SerializationError(msg)
    return data


def pack_payloads(values: Sequence[Any]) -> list[bytes]:
    """:func:`pack_payload` of every value, in order (ingest's batches): the same bytes and the same
    errors, for the first value that fails; about half the cost per small record, since the packer
    runs over the batch in one ``map`` and the checks are made once on the largest result."""
    packer = _PACKERS.packer
    try:
        out = list(map(packer.pack, values))
    except Exception:  # name the first value that fails, as pack_payload does (this raises)
        return [pack_payload(v) for v in values]
    if out and max(map(len, out)) > min(_PACKER_KEEP_BYTES, MAX_PAYLOAD_BYTES):
        return [pack_payload(v) for v in values]  # rare: pack_payload's size rules, one by one
    return out


# --- unpacking -----------------------------------------------------------------


def _dec_bigint(data: bytes) -> int:
    if len(data) > MAX_INT_DIGITS + 1:
        msg = f"big int ext of {len(data)} bytes exceeds {MAX_INT_DIGITS} digits"
        raise SerializationError(msg)
    return int(data)


def _dec_tuple(data: bytes, depth: int) -> tuple[Any, ...]:
    if depth >= MAX_TUPLE_DEPTH:
        msg = f"tuple ext nested more than {MAX_TUPLE_DEPTH} deep"
        raise SerializationError(msg)
    items = _unpack(data, depth + 1)
    if type(items) is not list:
        msg = f"tuple ext holds a {type(items).__name__!r}, not an array"
        raise SerializationError(msg)
    return tuple(items)


@functools.lru_cache(maxsize=512)
def _fixed_zone(micros: int) -> _dt.timezone:
    # Few distinct offsets occur in practice; caching saves two allocations per value.
    return _dt.timezone(_dt.timedelta(microseconds=micros))


def _dec_naive_datetime(data: bytes) -> _dt.datetime:
    y, mo, d, h, mi, s, us, fold = _DATETIME.unpack(data)
    return _dt.datetime(y, mo, d, h, mi, s, us, fold=fold)


def _dec_aware_datetime(data: bytes) -> _dt.datetime:
    y, mo, d, h, mi, s, us, fold, micros = _DATETIME_TZ.unpack(data)
    return _dt.datetime(y, mo, d, h, mi, s, us, tzinfo=_fixed_zone(micros), fold=fold)


def _dec_date(data: bytes) -> _dt.date:
    return _dt.date(*_DATE.unpack(data))


def _dec_time(data: bytes) -> _dt.time:
    h, mi, s, us, fold = _TIME.unpack(data)
    return _dt.time(h, mi, s, us, fold=fold)


def _dec_timedelta(data: bytes) -> _dt.timedelta:
    return _dt.timedelta(*_TIMEDELTA.unpack(data))


def _dec_decimal(data: bytes) -> decimal.Decimal:
    return decimal.Decimal(data.decode("ascii"))


def _dec_uuid(data: bytes) -> uuid.UUID:
    return uuid.UUID(bytes=data)


# None marks the tuple, which _ext_at decodes itself because it needs the depth.
_DECODERS: dict[int, tuple[str, Callable[[bytes], Any] | None]] = {
    EXT_BIGINT: ("big int", _dec_bigint),
    EXT_TUPLE: ("tuple", None),
    EXT_NAIVE_DATETIME: ("naive datetime", _dec_naive_datetime),
    EXT_AWARE_DATETIME: ("aware datetime", _dec_aware_datetime),
    EXT_DATE: ("date", _dec_date),
    EXT_TIME: ("time", _dec_time),
    EXT_TIMEDELTA: ("timedelta", _dec_timedelta),
    EXT_DECIMAL: ("decimal", _dec_decimal),
    EXT_UUID: ("uuid", _dec_uuid),
}


def _ext_at(depth: int, code: int, data: bytes) -> Any:
    entry = _DECODERS.get(code)
    if entry is None:
        msg = f"unknown msgpack ext code {code} ({len(data)} bytes of data)"
        raise SerializationError(msg)
    name, decoder = entry
    try:
        return _dec_tuple(data, depth) if decoder is None else decoder(data)
    except SerializationError:
        raise
    except (ValueError, TypeError, ArithmeticError, struct.error) as exc:
        msg = f"malformed {name} ext (code {code}, {len(data)} bytes): {exc}"
        raise SerializationError(msg) from exc


# Each tuple level is a nested unpackb whose context (~40 KiB) sits on the C
# stack, so an unbounded depth could crash the process, not just raise
# RecursionError; the prebuilt per-depth hooks carry the bound without state.
_EXT_HOOKS = [functools.partial(_ext_at, d) for d in range(MAX_TUPLE_DEPTH + 1)]


def _unpack(data: bytes, depth: int = 0) -> Any:
    # max_*_len default to len(data), which bounds allocation by the input size.
    # timestamp=3 turns msgpack's standard ext -1 into an aware datetime, a
    # supported type, instead of a msgpack.Timestamp that could not be re-packed.
    return _unpackb(
        data, ext_hook=_EXT_HOOKS[depth], raw=False, strict_map_key=False, timestamp=3
    )


def unpack_payload(data: bytes) -> Any:
    """Unpack bytes made by :func:`pack_payload` into the original value.

    ``data`` must hold exactly one msgpack object. Anything else (wrong input
    type, truncated or trailing bytes, invalid msgpack or UTF-8, an unknown or
    malformed ext, unhashable map keys, nesting too deep, more than
    ``MAX_PAYLOAD_BYTES``) raises ``SerializationError``. Arbitrary bytes that
    happen to be valid msgpack decode to a value of the supported types.
    """
    try:
        size = len(data)
    except TypeError as exc:
        msg = f"cannot unpack a payload from a {type(data).__name__!r}: expected bytes"
        raise SerializationError(msg) from exc
    if size > MAX_PAYLOAD_BYTES:
        msg = f"payload of {size} bytes exceeds MAX_PAYLOAD_BYTES ({MAX_PAYLOAD_BYTES})"
        raise SerializationError(msg)
    try:
        return _unpack(data)
    except SerializationError:
        raise
    except (ValueError, TypeError, ArithmeticError, RecursionError, msgpack.UnpackException) as exc:
        msg = f"cannot unpack a payload of {size} bytes: {type(exc).__name__}: {exc}"
        raise SerializationError(msg) from exc


_ARRAY32 = b"\xdd"  # msgpack: an array of up to 2**32 - 1 values, its size in the next 4 bytes


def unpack_run(data: bytes | memoryview, count: int) -> list[Any]:
    """``count`` payloads made by :func:`pack_payload`, back to back in ``data``, unpacked in one call.

    For a column of payloads whose bytes already lie back to back (an Arrow binary column's data):
    the run is read as one msgpack array of ``count`` values (the same options and ext hooks as
    :func:`unpack_payload`), with no call per payload. Raises ``SerializationError`` unless
    ``data`` is exactly ``count`` msgpack values: a run with one value too many or too few leaves
    bytes over or runs short. Which payload failed is not said (unpack them one by one to find out).
    Each payload's own bound (``MAX_PAYLOAD_BYTES``) is not checked here: the caller's lengths are.
    """
    if not 0 <= count < 1 << 32:
        msg = f"a run of {count} payloads cannot be unpacked as one msgpack array"
        raise SerializationError(msg)
    try:
        values = _unpack(b"".join((_ARRAY32, count.to_bytes(4, "big"), data)))
    except SerializationError:
        raise
    except (ValueError, TypeError, ArithmeticError, RecursionError, msgpack.UnpackException) as exc:
        msg = f"cannot unpack a run of {count} payloads ({len(data)} bytes): {type(exc).__name__}: {exc}"
        raise SerializationError(msg) from exc
    return values  # type: ignore[no-any-return]


def unpack_many(payloads: Sequence[bytes]) -> list[Any]:
    """Each of ``payloads`` unpacked as :func:`unpack_payload` does, in one call.

    For a column of payloads known to be ``bytes`` of at most ``MAX_PAYLOAD_BYTES``
    (an Arrow binary column checked by its lengths): no per-item checks around the
    unpacking, so it costs about a fifth less per item. Raises ``SerializationError``
    if any item fails; which one is not said (unpack them one by one to find out).
    """
    unpack = _unpackb
    hook = _EXT_HOOKS[0]
    try:
        return [unpack(p, ext_hook=hook, raw=False, strict_map_key=False, timestamp=3) for p in payloads]
    except SerializationError:
        raise
    except (ValueError, TypeError, ArithmeticError, RecursionError, msgpack.UnpackException) as exc:
        msg = f"cannot unpack one of {len(payloads)} payloads: {type(exc).__name__}: {exc}"
        raise SerializationError(msg) from exc

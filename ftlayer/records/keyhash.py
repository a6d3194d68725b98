"""Key hashing that agrees bit for bit with Spark SQL's ``xxhash64``.

``key_hash(key)`` is xxHash64 with seed 42, read as a signed 64-bit integer, of
the key encoded the way Spark encodes the column type that PySpark infers for
the Python value:

============  ================  =========================================
Python value  Spark type        bytes hashed
============  ================  =========================================
``str``       StringType        UTF-8 bytes
``bytes``     BinaryType        the bytes themselves
``bool``      BooleanType       4-byte little-endian int 1 or 0
``int``       LongType          8-byte little-endian two's complement;
                                ints outside 64 bits are refused
``float``     DoubleType        IEEE-754 bits, -0.0 hashed as 0.0
``None``      null              nothing: the running hash is returned as is
``tuple``     several columns   each element in turn, each seeded with the
                                previous element's hash (``xxhash64(a, b)``)
============  ================  =========================================

So for string and binary keys ``key_hash(k) == spark xxhash64(k)``; for an int
key it equals ``xxhash64(CAST(k AS BIGINT))`` (Python ints become bigint in
Spark). An ``int`` column in Spark (IntegerType) hashes 4 bytes instead, so it
matches only after a cast to bigint; that is documented, not guessed.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import xxhash

from ftlayer.errors import KeyHashError
from ftlayer.records.ids import to_signed64, to_unsigned64

SPARK_SEED = 42

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_NAN_BITS = struct.pack("<q", 0x7FF8000000000000)  # Java's canonical NaN


def _hash_one(value: Any, seed: int) -> int:
    useed = to_unsigned64(seed)
    if value is None:
        return seed
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif isinstance(value, bool):
        data = _I32.pack(1 if value else 0)
    elif isinstance(value, int):
        try:
            data = _I64.pack(value)
        except struct.error as exc:
            msg = f"integer key {value} does not fit in 64 bits (Spark LongType); convert it to str"
            raise KeyHashError(msg) from exc
    elif isinstance(value, float):
        data = _NAN_BITS if math.isnan(value) else _F64.pack(0.0 if value == 0.0 else value)
    elif isinstance(value, tuple):
        acc = seed
        for item in value:
            acc = _hash_one(item, acc)
        return acc
    else:
        msg = (
            f"cannot hash a key of type {type(value).__name__!r}: key selectors must return "
            "str, bytes, int, float, bool, None or a tuple of those"
        )
        raise KeyHashError(msg)
    return to_signed64(xxhash.xxh64_intdigest(data, seed=useed))


_xxh64 = xxhash.xxh64_intdigest
_SIGN64 = 1 << 63


def key_hash(key: Any) -> int:
    """Spark-compatible signed 64-bit hash of a key (see the module table). Pure."""
    if type(key) is str:  # the common key, once per keyed record: no type dispatch
        try:
            value = _xxh64(key.encode("utf-8"), SPARK_SEED)
        except UnicodeEncodeError:
            return _hash_one(key, SPARK_SEED)  # raises as every other path does
        return value - (1 << 64) if value >= _SIGN64 else value
    return _hash_one(key, SPARK_SEED)


def key_hashes(keys: Sequence[Any]) -> list[int]:
    """``[key_hash(k) for k in keys]``, the same values and the same errors (ingest's batches);
    :func:`key_hash_array`'s values as a list."""
    values: list[int] = key_hash_array(keys).tolist()
    return values


def key_hash_array(keys: Sequence[Any]) -> Any:
    """The key hashes of ``keys`` as a numpy ``int64`` array: ``key_hash(k)`` for each, the same
    errors (ingest's batches, handed on as an array to the channel choice and the frames).

    A batch of ``str`` keys (the common case) is hashed with no Python step per key: the
    encoding and the digests run in C over the batch (``map``) and the unsigned digests
    become signed in one numpy step; about half the cost of a ``key_hash`` call per key.
    Any other batch (a key of another type, a string that is not valid UTF-8) takes
    :func:`key_hash` key by key, which raises as it does for the first key that fails.
    """
    import numpy as np

    n = len(keys)
    try:
        digests = np.fromiter(map(_xxh64, map(str.encode, keys), repeat(SPARK_SEED)), dtype=np.uint64, count=n)
    except (TypeError, UnicodeEncodeError):  # not all str (str.encode refuses the others), or unencodable
        return np.fromiter(map(key_hash, keys), dtype=np.int64, count=n)
    return digests.view(np.int64)


def pmod(value: int, n: int) -> int:
    """Spark SQL's ``pmod``: the non-negative remainder. Python's ``%`` already is one."""
    return value % n


#: The key hash of a record without a key (``key_hash(None)``).
NO_KEY_HASH = key_hash(None)

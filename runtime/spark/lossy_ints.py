"""Floats with a fraction bound for an integer column: what pyarrow converts with loss and no error.

``pa.array([2.5], type=pa.int64())`` gives ``[2]`` (pyarrow 26), and the same inside lists, structs
and maps. The typed read's contract (:mod:`runtime.spark.payload_columns`) refuses a value Arrow can
keep only with loss, so a column whose type holds an integer type anywhere is checked here after its
conversion: :func:`fractions` names the values that held such a float (``2.0`` converts exactly and
passes). A column with no integer type costs one cached type walk; a top-level integer column one
``set(map(type, ...))`` over its values unless it holds floats; only nested integer types (an
``array<int>``) walk each value.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["fractions"]


@functools.lru_cache(maxsize=256)
def _holds_int(typ: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_integer(typ):
        return True
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return _holds_int(typ.value_type)
    if pa.types.is_map(typ):
        return _holds_int(typ.key_type) or _holds_int(typ.item_type)
    if pa.types.is_struct(typ):
        return any(_holds_int(typ.field(k).type) for k in range(typ.num_fields))
    return False


def _lossy(value: Any, typ: Any) -> bool:
    import pyarrow as pa

    if value is None:
        return False
    if pa.types.is_integer(typ):
        return type(value) is float and not value.is_integer()
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return isinstance(value, (list, tuple)) and any(_lossy(v, typ.value_type) for v in value)
    if pa.types.is_map(typ):
        pairs = value.items() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        return any(isinstance(p, tuple) and len(p) == 2 and (_lossy(p[0], typ.key_type) or _lossy(p[1], typ.item_type))
                   for p in pairs)
    if pa.types.is_struct(typ):
        return isinstance(value, dict) and any(_lossy(value.get(typ.field(k).name), typ.field(k).type)
                                               for k in range(typ.num_fields))
    return False


def fractions(values: list[Any], typ: Any) -> list[int]:
    """The positions of ``values`` (a column's Python values, converted by pyarrow to ``typ`` without an
    error) that hold a float with a fraction where ``typ`` has an integer type, at any depth."""
    import pyarrow as pa

    if not _holds_int(typ):
        return []
    if pa.types.is_integer(typ):
        if float not in set(map(type, values)):
            return []
        return [i for i, v in enumerate(values) if type(v) is float and not v.is_integer()]
    return [i for i, v in enumerate(values) if _lossy(v, typ)]

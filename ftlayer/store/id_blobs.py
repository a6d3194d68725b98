"""Ids as the Lua stores and receives them: signed 64-bit ints, 8 big-endian bytes each, concatenated."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ftlayer.errors import AckerError

__all__ = ["pack_ids", "unpack_ids"]


def pack_ids(ids: Sequence[int]) -> bytes:
    """Signed 64-bit ids as concatenated 8-byte big-endian strings (the form Lua stores)."""
    return struct.pack(f">{len(ids)}q", *ids)


def unpack_ids(blob: bytes) -> list[int]:
    """Inverse of :func:`pack_ids`; the length must be a multiple of 8."""
    if len(blob) % 8:
        msg = f"packed id blob of {len(blob)} bytes is not a multiple of 8"
        raise AckerError(msg)
    return list(struct.unpack(f">{len(blob) // 8}q", blob))

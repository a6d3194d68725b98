"""The array CRC-32 gives zlib.crc32's value for every row, whatever the width."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.records.crc_arrays import crc32_rows


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 70).flatmap(lambda width: st.lists(st.binary(min_size=width, max_size=width), max_size=40)),
       st.integers(0, 70))
def test_rows_have_zlibs_crc(rows: list[bytes], width_if_empty: int) -> None:
    width = len(rows[0]) if rows else width_if_empty
    array = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), width)
    got = crc32_rows(array)
    assert got.dtype == np.uint32
    assert got.tolist() == [zlib.crc32(r) for r in rows]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=48, max_size=48), min_size=1, max_size=30))
def test_a_strided_column_slice_as_frames_cut_it(headers: list[bytes]) -> None:
    """Ingest passes the covered bytes [4:44) of a block of 48-byte headers: a non-contiguous view."""
    block = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), 48)
    assert crc32_rows(block[:, 4:44]).tolist() == [zlib.crc32(h[4:44]) for h in headers]


def test_every_byte_value_at_every_position_of_a_word() -> None:
    rows = np.zeros((256 * 8, 8), dtype=np.uint8)
    for pos in range(8):
        rows[pos * 256 : (pos + 1) * 256, pos] = np.arange(256)
    assert crc32_rows(rows).tolist() == [zlib.crc32(bytes(r)) for r in rows]


def test_refuses_anything_but_rows() -> None:
    with pytest.raises(ValueError, match="2-D"):
        crc32_rows(np.zeros(4, dtype=np.uint8))

"""The array CRC-32 gives zlib.crc32's value for every row, whatever the width."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.records.crc_arrays import RAGGED_MAX_BYTES, crc32_ragged, crc32_rows


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


@st.composite
def ragged(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A buffer and rows inside it: lengths from 0 to past RAGGED_MAX_BYTES (both paths), any start
    (unaligned words), any CRC to continue from."""
    blob = random.Random(draw(st.integers(0, 2**32 - 1))).randbytes(draw(st.integers(0, 600)))
    rows = []
    for _ in range(draw(st.integers(0, 30))):
        start = draw(st.integers(0, len(blob)))
        length = min(len(blob) - start, draw(st.integers(0, 8) | st.integers(0, 70) | st.integers(60, 600)))
        rows.append((start, length, draw(st.integers(0, 0xFFFFFFFF))))
    return blob, rows


@settings(max_examples=300, deadline=None)
@given(ragged())
def test_ragged_rows_have_zlibs_crc_continued_from_their_init(case: tuple[bytes, list[tuple[int, int, int]]]) -> None:
    blob, rows = case
    starts, lengths, init = ([r[k] for r in rows] for k in range(3))
    got = crc32_ragged(blob, starts, lengths, init)
    assert got.dtype == np.uint32
    assert got.tolist() == [zlib.crc32(blob[s : s + n], i) for s, n, i in rows]


def test_ragged_rows_of_every_length_around_the_array_limit() -> None:
    blob = bytes(range(256)) * 8
    rows = [(start, length) for length in range(RAGGED_MAX_BYTES + 9) for start in (0, 1, 2, 3, 517)]
    got = crc32_ragged(blob, [s for s, _ in rows], [n for _, n in rows], [7] * len(rows))
    assert got.tolist() == [zlib.crc32(blob[s : s + n], 7) for s, n in rows]


def test_a_ragged_row_outside_the_buffer_is_refused() -> None:
    with pytest.raises(IndexError, match="outside the 10-byte buffer"):
        crc32_ragged(b"0123456789", [4], [7], [0])
    assert crc32_ragged(b"", [], [], []).tolist() == []

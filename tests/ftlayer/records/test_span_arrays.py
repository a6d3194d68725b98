"""pending_span_arrays and ChannelBatch.spans against the per-record walk they replace (pending_spans)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.acker.persistence import ChannelBatch
from ftlayer.records.chunks import STATE_HEADER, pending_spans
from ftlayer.records.span_arrays import pending_span_arrays


@st.composite
def chunks(draw: st.DrawFn) -> tuple[bytes, bytes, bytes]:
    """A chunk as read: a 6-byte key (any top bit, so negative ids too), a state with random
    settled bits, and frames of random lengths (holes are 4 zero bytes), sometimes damaged: cut
    short, or with one length prefix made to run past the end."""
    n = draw(st.integers(0, 40))
    lengths = draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    frames = b"".join(struct.pack(">I", k) + bytes([j % 251]) * k for j, k in enumerate(lengths))
    damage = draw(st.sampled_from(["none", "none", "truncate", "long-prefix"]))
    if damage == "truncate" and frames:
        frames = frames[: draw(st.integers(0, len(frames) - 1))]
    elif damage == "long-prefix" and n:
        at = sum(4 + k for k in lengths[: draw(st.integers(0, n - 1))])
        frames = frames[:at] + struct.pack(">I", len(frames) + draw(st.integers(1, 99))) + frames[at + 4 :]
    settled = bytes(draw(st.lists(st.integers(0, 255), min_size=(n + 7) // 8, max_size=(n + 7) // 8)))
    state = STATE_HEADER.pack(1, 1, 0, n, n, 0, 0) + settled
    return draw(st.binary(min_size=6, max_size=6)), state, frames


def _model(key: bytes, state: bytes, frames: bytes, cut: tuple[int, int] | None) -> list[tuple[int, int, int]]:
    return [(sid, a, b) for sid, a, b in pending_spans(key, state, frames)
            if cut is None or cut[0] < (sid & 0xFFFF) <= cut[1]]


cuts = st.none() | st.tuples(st.integers(-1, 40), st.integers(-1, 40))


@settings(max_examples=300)
@given(chunks(), cuts)
def test_the_arrays_hold_what_pending_spans_yields(chunk: tuple[bytes, bytes, bytes],
                                                   cut: tuple[int, int] | None) -> None:
    key, state, frames = chunk
    sids, starts, ends = pending_span_arrays(key, state, frames, cut)
    got = list(zip(sids.tolist(), starts.tolist(), ends.tolist(), strict=True))
    assert got == _model(key, state, frames, cut)


@settings(max_examples=150)
@given(st.lists(chunks(), max_size=5), st.data())
def test_channel_batch_spans_are_the_pending_frames_in_read_order(chunk_list: list[tuple[bytes, bytes, bytes]],
                                                                  data: st.DataObject) -> None:
    unique = list({key: (key, state, frames) for key, state, frames in chunk_list}.values())
    cut_of = {key: data.draw(cuts) for key, _, _ in unique}
    batch = ChannelBatch(0, "1-0", unique, cuts={k: c for k, c in cut_of.items() if c is not None})
    spans = batch.spans()
    blob, starts, lengths, sids, vouched = spans.blob, spans.starts, spans.lengths, spans.sids, spans.vouched
    want_sids, want_frames = batch.pending()
    assert sids.tolist() == want_sids
    assert [blob[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)] == want_frames
    assert blob == b"".join(frames for _, _, frames in unique)
    assert not vouched.any()  # no chunk here ends with a chunk CRC
    assert spans.columns is None  # nor with a columns section


def test_a_sound_chunk_with_settled_records_and_a_hole() -> None:
    frames = struct.pack(">I", 2) + b"ab" + struct.pack(">I", 0) + struct.pack(">I", 3) + b"xyz"
    key = bytes([0x80, 0, 0, 0, 0, 1])  # top bit set: the ids are negative
    state = STATE_HEADER.pack(1, 1, 0, 3, 2, 0, 0) + bytes([0b010])  # record 1 (the hole) settled
    sids, starts, ends = pending_span_arrays(key, state, frames)
    base = int.from_bytes(key + b"\0\0", "big", signed=True)
    assert sids.tolist() == [base, base | 2]
    assert (starts.tolist(), ends.tolist()) == ([0, 10], [6, 17])
    assert pending_span_arrays(key, state, frames, (0, 2))[0].tolist() == [base | 2]


def test_a_bitmap_too_short_for_the_record_count_is_refused() -> None:
    state = STATE_HEADER.pack(1, 1, 0, 9, 9, 0, 0) + b"\0"
    frames = struct.pack(">I", 0) * 9
    with pytest.raises(IndexError):
        list(pending_spans(b"\0" * 6, state, frames))
    with pytest.raises(IndexError, match="9 records"):
        pending_span_arrays(b"\0" * 6, state, frames)

"""Offsets of the FT source: positions in a channel stream, down to one record.

An FT source offset maps each channel stream (``"ch<c>"``, ``"ch<c>s<shard>"``) to a
**position**, written as a string:

- ``"<ms>-<seq>"``: everything up to and including stream entry ``<ms>-<seq>`` (``"0-0"``:
  nothing yet). This is the only form older checkpoints hold;
- ``"<ms>-<seq>@<chunk id hex>.<i>"``: everything before that entry, and of that entry its
  chunks up to chunk ``<chunk id>`` (in the order the entry lists them) with records ``0..i``
  of that chunk. An entry holds one persist call's chunks of the channel (up to
  ``ingest_batch_records`` records), so only this form lets ``max_records_per_batch`` cap a
  batch at a number of records rather than of entries.

Order: entries compare by id; within one entry a partial position lies before the whole entry.
Two partial positions of one entry are ordered by their chunk's place in the entry, which
only the stream knows: :func:`compare_ids` reports them as unequal (``a`` after ``b`` when the
strings differ), which is all its callers need (an empty range is ``end == start``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ftlayer.errors import ConfigError
from ftlayer.records.chunks import CHUNK_KEY_BYTES

__all__ = ["START_ID", "Position", "compare_ids", "max_id", "min_id", "parse_id"]

START_ID = "0-0"  # "nothing read yet": no real stream entry has id 0-0


def parse_id(stream_id: str) -> tuple[int, int]:
    """A Redis stream id ``"<ms>-<seq>"`` (a position's entry) as a comparable pair; ConfigError if malformed."""
    ms, sep, seq = stream_id.partition("@")[0].partition("-")
    try:
        return int(ms), int(seq) if sep else 0
    except ValueError as exc:
        msg = f"invalid stream id {stream_id!r} in an FT source offset: expected '<ms>-<seq>'"
        raise ConfigError(msg) from exc


@dataclass(frozen=True)
class Position:
    """A parsed position (see the module notes). ``chunk`` is None for a whole entry."""

    entry: str
    chunk: bytes | None = None
    index: int = -1

    @classmethod
    def parse(cls, text: str) -> Position:
        entry, sep, rest = text.partition("@")
        parse_id(entry)
        if not sep:
            return cls(entry)
        hexkey, _, index = rest.partition(".")
        try:
            chunk = bytes.fromhex(hexkey)
            i = int(index)
        except ValueError as exc:
            msg = f"invalid FT source position {text!r}: expected '<ms>-<seq>@<chunk id hex>.<index>'"
            raise ConfigError(msg) from exc
        if len(chunk) != CHUNK_KEY_BYTES or i < 0:
            msg = f"invalid FT source position {text!r}: a chunk id has {CHUNK_KEY_BYTES} bytes, an index is >= 0"
            raise ConfigError(msg)
        return cls(entry, chunk, i)

    @property
    def whole(self) -> bool:
        return self.chunk is None

    def __str__(self) -> str:
        return self.entry if self.chunk is None else f"{self.entry}@{self.chunk.hex()}.{self.index}"


def compare_ids(a: str, b: str) -> int:
    """-1, 0 or 1 as position ``a`` sorts before, equal to or after ``b`` (see the module notes)."""
    pa, pb = parse_id(a), parse_id(b)
    if pa != pb:
        return (pa > pb) - (pa < pb)
    if a == b:
        return 0
    whole_a, whole_b = "@" not in a, "@" not in b
    if whole_a != whole_b:
        return 1 if whole_a else -1
    return 1  # two partial positions of one entry: unequal (their order is the stream's)


def max_id(a: str, b: str) -> str:
    return a if compare_ids(a, b) >= 0 else b


def min_id(a: str, b: str) -> str:
    return a if compare_ids(a, b) <= 0 else b

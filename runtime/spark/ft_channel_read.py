"""The FT source's read of one channel range: pages of server-side reads, frames to Arrow.

A read task reads its channel's stream ids ``(start, end]`` in each shard (start exclusive,
end inclusive) in pages, skipping records no longer pending, and yields one
``pyarrow.RecordBatch`` per page (:mod:`runtime.spark.arrow_codec`), with the columns sections
of the page's chunks where every one has one (``ftlayer.records.chunk_columns``). A re-run batch (same start
and end) therefore reads the same records minus those completed or failed in the meantime. The
read never acks or XORs anything; the one thing it writes is a fail, for a stored frame that
fails its checks (a CRC mismatch): that record goes to the dead-letter queue with the reason,
without replays (``FTLayer.fail_unreadable``), and the rest are read.

Paging: the first server-side call of a range reads ``read_page_entries`` stream entries; later
calls double or halve that, up to ``MAX_READ_PAGE_ENTRIES``, aiming at about
:data:`READ_TARGET_RECORDS` records per call (one entry holds the ids of one persist call).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ftlayer.acker.batch_acks import BATCH_KEY_TTL_S
from ftlayer.acker.persistence import PendingSpans
from ftlayer.errors import FrameError
from ftlayer.facade.ft_layer import FTLayer
from runtime.spark.arrow_codec import frames_to_record_batch, spans_to_record_batch, split_bad_frames
from runtime.spark.batch_holds import HOLD_SET_MARGIN_S
from runtime.spark.ft_offsets import START_ID, Position, compare_ids
from runtime.spark.ft_options import MAX_READ_PAGE_ENTRIES, FTSourceOptions

__all__ = ["READ_TARGET_RECORDS", "read_pages"]

READ_TARGET_RECORDS = 10_000  # records per server-side read call that paging aims at


def read_pages(layer: FTLayer, opts: FTSourceOptions, c: int, shard: int, after: str, *, until: str,
               tag: str | None = None, notes_skips: bool = False) -> Iterator[tuple[Any, Any]]:
    """Arrow batches (SOURCE_ROW) of the still-pending records of stream ids ``(after, until]`` of
    channel ``c``'s stream in ``shard`` (either bound may be a position inside an entry), read in
    pages, each with the columns sections of its records' chunks (``PendingSpans.columns``: None
    unless every chunk of the page has one, and None for a page whose damaged frames were left out;
    the typed read's columnar path,
    :mod:`runtime.spark.stored_columns`). With ``tag`` (the micro-batch), each read call files what
    it read under the batch's hold; with ``notes_skips`` (the DataFrame path, which settles a batch
    at Spark's commit) it also notes the records of the range no longer pending."""
    if compare_ids(until, after) <= 0:
        return
    page = opts.read_page_entries
    hold_ttl_ms = int((opts.max_batch_s + HOLD_SET_MARGIN_S) * 1000)
    # the DataFrame path settles a batch's reads at Spark's commit: note what this read skips
    skips_ttl_ms = BATCH_KEY_TTL_S * 1000 if notes_skips else None
    # positions inside an entry (runtime.spark.ft_offsets): the server begins and ends at their
    # chunks, and the reader keeps only the records of those chunks inside the range
    first, last = Position.parse(after), Position.parse(until)
    cuts: dict[bytes, tuple[int, int]] = {}
    if first.chunk is not None:
        cuts[first.chunk] = (first.index, 1 << 16)
    if last.chunk is not None:
        lo = cuts.get(last.chunk, (-1, 0))[0]
        cuts[last.chunk] = (lo, last.index)
    start_chunk = first.chunk or b""
    after = first.entry
    skip = 0  # chunks of entry `after` already read: a read call is bounded and may stop inside an entry
    first_call = True  # this read's first call counts the read (dfs:<tag>, DataFrame path)
    while True:
        batch = layer.read_channel(c, shard=shard, after="-" if after == START_ID else after, until=last.entry,
                                   max_entries=page, skip=skip, hold=tag, hold_ttl_ms=hold_ttl_ms,
                                   skips_ttl_ms=skips_ttl_ms if tag is not None else None,
                                   first_call=first_call, start_chunk=start_chunk,
                                   end_chunk=last.chunk or b"", cuts=cuts)
        start_chunk, first_call = b"", False  # the start bound is the first call's only
        spans = batch.spans()
        sids = spans.sids
        if len(sids):
            for raw in _arrow(layer, spans):
                yield raw, (spans.columns if raw.num_rows == len(sids) else None)
        if not batch.last_id or (not batch.skip and compare_ids(batch.last_id, until) >= 0):
            return
        after, skip = batch.last_id, batch.skip
        # an entry holds one persist call's chunks for this channel (1 to flush_batch_size records):
        # steer the page so that one server-side call returns about READ_TARGET_RECORDS
        got = len(sids)
        if got < READ_TARGET_RECORDS // 2:
            page = min(page * 2, MAX_READ_PAGE_ENTRIES)
        elif got > READ_TARGET_RECORDS * 2:
            page = max(page // 2, 1)


def _arrow(layer: FTLayer, spans: PendingSpans) -> list[Any]:
    """The Arrow batch of the frames read; one that fails its checks (a CRC mismatch) is
    failed in Redis for the dead-letter queue (by its place in its chunk) and left out, so
    the channel goes on. A frame whose chunk CRC matched (``spans.vouched``) skips its own CRC (a
    chunk whose CRC does not match, or that has none, has every frame checked, and the slow path
    below checks every frame of the page alone)."""
    blob, starts, lengths, sids, vouched = spans.blob, spans.starts, spans.lengths, spans.sids, spans.vouched
    try:
        return [spans_to_record_batch(blob, starts, lengths, vouched)]
    except FrameError:
        frames = [blob[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
        good, bad = split_bad_frames(frames)
        layer.fail_unreadable([(int(sids[i]), f"unreadable frame: {reason}") for i, reason in bad])
        return [frames_to_record_batch(good)] if good else []

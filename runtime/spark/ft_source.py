"""The FT source: a PySpark streaming data source over one ftlayer source's channel streams.

``spark.readStream.format("ftlayer")`` (the ``DataSource`` classes and ``register`` are in
:mod:`runtime.spark.ft_data_sources`, light for Spark's planner processes to import) or
:func:`~runtime.spark.ft_data_sources.read_stream` gives one row per persisted source record, with the columns
of :data:`runtime.spark.row_contract.SOURCE_ROW`::

    sid long, cid long, key_hash long, origin long, replay int, channel int, payload binary

Offsets, partitions, commit
===========================

- An offset is ``{"ch0": "<position>", "ch1": ..., }``: one position per
  channel stream, a Redis stream id (``"0-0"`` = nothing read yet) or a
  position inside an entry, down to one record (``runtime.spark.ft_offsets``). ``initialOffset`` puts every
  channel at ``"0-0"``. ``latestOffset`` reads every channel's last generated
  id in one pipelined round trip; it never moves a channel backwards.
- ``partitions(start, end)`` returns exactly ``num_channels`` partitions, always,
  and partition ``i`` reads channel ``i``: inside ``read()`` and anywhere
  downstream before a shuffle, ``TaskContext.get().partitionId()`` (and
  ``spark_partition_id()``) equals the channel. Channels with nothing new get an
  empty partition so the numbering never shifts.
- ``read()`` reads the pending records of the channel's range in pages and yields Arrow
  batches (:mod:`runtime.spark.ft_channel_read`); it never acks or XORs anything.
- ``commit(end)`` trims every channel stream up to ``end`` (one pipelined round
  trip). Trimming removes only the stream index: records still pending stay in
  their chunks and time out or get acked as usual. Spark (4.3) calls ``commit`` for
  batch N only when it plans batch N+1, so the last batch's entries would stay
  until more data came. ``latestOffset(start, ...)`` therefore also trims up to
  ``start`` in its round trip: Spark asks for data after ``start`` only once the
  batches up to ``start`` have completed (a batch re-run after a restart is
  planned from the offset log without ``latestOffset``). A trim that came too
  early could not lose a record anyway: a pending record stays in its chunk and
  is replayed when it times out.

Admission control: with ``max_records_per_batch`` a batch ends inside a stream entry if it
must (:mod:`runtime.spark.ft_batch_ends`); ``Trigger.AvailableNow`` is supported natively.

Which process runs what: as every channel source (:mod:`runtime.spark.channel_source`, which
holds what the FT, feed and typed sources share). The source runner keeps one reader for the
query's life (the AvailableNow target, the batch holds); every Redis client is created lazily
in the process that uses it (``ftlayer.store.connection.client_for``) and never pickled.
Options: :mod:`runtime.spark.ft_options`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from ftlayer.acker.batch_acks import batch_tag
from ftlayer.acker.holds import CARRY_PREFIX
from ftlayer.errors import FTLayerError
from ftlayer.logs import logger_for
from runtime.spark.admission import max_rows
from runtime.spark.arrow_codec import SOURCE_SCHEMA_DDL
from runtime.spark.batch_holds import HOLD_SET_MARGIN_S, BatchHolds
from runtime.spark.channel_source import ChannelPartition
from runtime.spark.ft_batch_ends import Offset, capped_end, entry_chunks
from runtime.spark.ft_channel_read import read_pages
from runtime.spark.ft_offsets import START_ID, Position, compare_ids
from runtime.spark.ft_offsets import max_id as _max_id
from runtime.spark.ft_offsets import min_id as _min_id
from runtime.spark.ft_options import FORMAT, FTSourceOptions, source_options
from runtime.spark.ft_streams import FTStreamsReader, channel_key
from runtime.spark.row_contract import SOURCE_ROW
from runtime.spark.worker_heap import freeze_worker_heap

if TYPE_CHECKING:
    pass

__all__ = [
    "FORMAT",
    "SOURCE_SCHEMA_DDL",
    "FTPartition",
    "FTSourceOptions",
    "FTStreamReader",
    "Offset",
    "channel_key",
    "compare_ids",
    "source_options",
    "source_schema",
]

log = logger_for(__name__)


def source_schema() -> StructType:
    """The Spark schema of the FT source: :data:`runtime.spark.row_contract.SOURCE_ROW`'s."""
    return SOURCE_ROW.struct_type()


class FTPartition(ChannelPartition):
    """Input partition ``channel`` of a micro-batch: stream ids in ``(start, end]`` of that channel's
    stream in each shard (``ranges``: ``(shard, start, end)``; one range for a one-shard source).
    ``tag`` names the micro-batch (``ftlayer.acker.batch_acks.batch_tag`` of its end offset): the read
    files what it read under it (the batch's hold set and, on the DataFrame path, its emitted ids)."""

    def __init__(self, channel: int, start: str, end: str,
                 more: Sequence[tuple[int, str, str]] = (), tag: str | None = None) -> None:
        super().__init__(channel, start, end)
        self.ranges: list[tuple[int, str, str]] = [(0, start, end), *more]
        self.tag = tag


class FTStreamReader(FTStreamsReader):
    """Stream reader of one ftlayer source (see the module notes for offsets and processes)."""

    # the DataFrame path's reader (typed_source) settles each batch at Spark's commit: its read
    # tasks note the records of their range no longer pending (ftlayer.keyspace.keys ``dfs:<tag>``)
    NOTES_SKIPS = False

    def __init__(self, options: FTSourceOptions) -> None:
        super().__init__(options)
        self._holds: BatchHolds | None = None  # driver side only: the running batch's hold
        self._carry: str | None = None  # driver side only: the hold of the unread rest of a cut entry

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_holds"] = None  # a thread of the source runner: never shipped to a read task
        state["_carry"] = None
        return state

    # --- DataSourceStreamReader -------------------------------------------------
    def initialOffset(self) -> Offset:
        """Every channel at ``"0-0"``: read each stream from its beginning."""
        return {key: START_ID for _, _, key in self.streams}

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: remember the current tails; no batch reads past them."""
        self._check_once()
        super().prepareForTriggerAvailableNow()

    def latestOffset(self, start: Offset | None = None, limit: Any = None) -> Offset:
        """The end offset of the next batch: the tails, capped by the AvailableNow target and ``limit``.

        Spark asks for the batch after ``start`` only once every batch up to
        ``start`` has completed, so the same round trip trims the streams up to
        ``start`` (Spark itself calls :meth:`commit` for a batch only when it
        plans the next one, which would leave the last batch's entries behind).
        Without admission control (pyspark 4.0 calls it with no arguments) it
        returns the tails: no cap, no trim.
        """
        # a cluster failover is waited out, not an error: every call here is idempotent
        self.layer.store.ride_out(self._check_once)
        if start is None:
            tails = self._last_tails = self.layer.store.ride_out(self.tails)
            return tails
        self._check_offset(start, "start")
        self._committed(start)
        tails = self._last_tails = self.layer.store.ride_out(lambda: self.tails(trim_upto=start))
        end: Offset = {}
        for _, _, k in self.streams:
            tail = tails[k] if self._target is None else _min_id(tails[k], self._target[k])
            end[k] = _max_id(start[k], tail)
        cap = max_rows(limit)
        if cap is not None:  # reads only: a cluster failover is waited out here too
            uncapped = end
            end = self.layer.store.ride_out(lambda: capped_end(self.layer, self.streams, start, uncapped, cap))
        return end

    def partitions(self, start: Offset, end: Offset) -> Sequence[FTPartition]:
        """One partition per channel, partition ``i`` = channel ``i`` (empty ranges included), reading
        that channel's stream of every shard."""
        self._check_offset(start, "start")
        self._check_offset(end, "end")
        tag = batch_tag(end)
        if any(compare_ids(end[k], start[k]) > 0 for k in end):
            self.batch_holds().begin(tag)  # the batch's records do not time out while it runs
        n = self.layer.num_shards
        out = []
        for c in self.channels:
            keys = [channel_key(c, k, n) for k in range(n)]
            more = [(k, start[keys[k]], end[keys[k]]) for k in range(1, n)]
            out.append(FTPartition(c, start[keys[0]], end[keys[0]], more, tag=tag))
        return out

    # --- commit: settle and end the hold of a committed batch ---------------------------
    def batch_holds(self) -> BatchHolds:
        """The driver-side holds of this query's batches (created, with its thread, on first use)."""
        if self._holds is None:
            self._holds = BatchHolds(self.layer, max_batch_s=self.opts.max_batch_s, lease_s=self.opts.hold_lease_s)
        return self._holds

    def _committed(self, end: Mapping[str, str]) -> None:
        """Spark committed the batch that ends at ``end``: settle its records, then end its hold.

        Spark calls ``latestOffset(start)`` only once the batch ending at ``start`` is in the
        commit log, and ``commit(end)`` after that too; both come here (idempotent: a tag is
        settled once per reader, and settling again finds nothing pending).
        """
        if all(v == START_ID for v in end.values()):
            return
        tag = batch_tag(end)
        holds = self.batch_holds()
        if holds.settled(tag):
            return
        self.layer.store.ride_out(lambda: self.settle(tag))
        carry = self._carry_tail(end, tag)  # before the batch's hold ends: no gap between the two
        holds.end(tag)
        # the batch that read the earlier carries committed; a carry left by an earlier run of
        # the query (it died, this reader is new) goes too
        if self._carry is not None and self._carry != carry:
            holds.end(self._carry)
        self._carry = carry
        try:
            self.layer.end_carries(keep=carry)
        except FTLayerError as exc:  # it lapses within a lease anyway
            log.warning("could not end the earlier carry holds of %s: %s", self.layer.keys.prefix, exc)

    def _carry_tail(self, end: Mapping[str, str], tag: str) -> str | None:
        """Hold the unread rest of every entry the batch ending at ``end`` stopped inside (see
        ``runtime.spark.batch_holds``); returns the carry hold's tag, or None if there is none."""
        tails: dict[int, list[bytes]] = {}
        for c, s, k in self.streams:
            pos = Position.parse(end.get(k, START_ID))
            if pos.chunk is None:
                continue
            keys = self.layer.store.ride_out(partial(entry_chunks, self.layer, c, s, pos.entry))
            if pos.chunk in keys:  # the cut chunk (its records after the cut) and every chunk after it
                tails.setdefault(s, []).extend(keys[keys.index(pos.chunk):])
        if not tails:
            return None
        carry = f"{CARRY_PREFIX}{tag}"
        ttl_ms = int((self.opts.max_batch_s + HOLD_SET_MARGIN_S) * 1000)
        self.batch_holds().carry(carry, tails, ttl_ms)
        return carry

    def settle(self, tag: str) -> None:
        """What a committed batch ``tag`` settles: nothing here (the Topology path acks in its sink
        tasks); the DataFrame path's reader acks the records its read tasks emitted."""
        return None

    def read(self, partition: FTPartition) -> Iterator[Any]:  # type: ignore[override]
        """Arrow record batches (SOURCE_ROW) of the still-pending records of ``(start, end]`` of one
        channel, of each shard."""
        for raw, _ in self.pages(partition):
            yield raw

    def pages(self, partition: FTPartition) -> Iterator[tuple[Any, Any]]:
        """:meth:`read`'s batches, each with its chunks' columns sections (``read_pages``)."""
        freeze_worker_heap(self.opts.freeze_worker_heap)
        tag = getattr(partition, "tag", None)
        for shard, after, until in partition.ranges:
            yield from read_pages(self.layer, self.opts, partition.channel, shard, after, until=until, tag=tag,
                                  notes_skips=self.NOTES_SKIPS)

    def commit(self, end: Offset) -> None:
        """Spark committed everything up to ``end``: settle that batch (if ``latestOffset`` has not),
        then trim each channel stream there (one round trip)."""
        self._check_offset(end, "committed")
        self._committed(end)

        def trim() -> None:
            pipe = self.layer.client.pipeline(transaction=False)
            self._queue_trims(pipe, end)
            pipe.execute()

        self.layer.store.ride_out(trim)  # idempotent: a cluster failover is waited out

"""The FT source: a PySpark streaming data source over one ftlayer source's channel streams.

``spark.readStream.format("ftlayer")`` (after :func:`register`) or
:func:`read_stream` gives one row per persisted source record, with the columns
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
- ``read()`` reads the channel's stream ids in ``(start, end]`` (start
  exclusive, end inclusive) in pages, skipping records no longer pending, and
  yields ``pyarrow.RecordBatch`` es (one per page). A re-run batch (same start
  and end) therefore reads the same records minus those completed or failed in
  the meantime. The source never acks or XORs anything; the one thing it
  writes is a fail, for a stored frame that fails its checks (a CRC
  mismatch): that record goes to the dead-letter queue with the reason, without
  replays (``FTLayer.fail_unreadable``), and the rest are read.
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

Admission control (where pyspark has it, see :mod:`runtime.spark.admission`; pyspark 4.0
calls ``latestOffset()`` with no arguments and gets the tails, uncapped): with option ``max_records_per_batch`` the
default read limit is ``ReadMaxRows(n)``. ``latestOffset`` then takes whole
stream entries from each channel stream while they fit in its share (``ceil(n /
streams)`` records, counting every record filed in an entry, completed ones
included), and ends the batch inside the entry where the share is reached (a
position after that entry's first records), so a batch holds at most ``n``
records however large one persist call was; a channel stream's trim then keeps
that entry until it has been read whole. Spark's ``ReadAllAvailable`` (e.g. ``Trigger.Once``) always wins
over the option. ``Trigger.AvailableNow`` is supported natively: the tails at
start become the target and batches honour the read limit until they reach it.

Which process runs what
=======================

PySpark runs each method in a Python process that the JVM starts, never in the
user's driver process:

- ``initialOffset``, ``latestOffset``, ``getDefaultReadLimit``,
  ``prepareForTriggerAvailableNow``, ``reportLatestOffset``, ``partitions``
  and ``commit`` run on the driver machine in one long-lived
  ``python_streaming_source_runner`` process per query (one reader instance for
  the query's life, so it can keep state such as the AvailableNow target).
- ``read`` runs in executor Python workers on a reader that was pickled during
  planning. Every Redis client is therefore created lazily in the process that
  uses it (``ftlayer.store.connection.client_for`` caches one per process and URL) and
  is never pickled.

Options (all strings, as Spark passes them): ``redis_url`` (required; executors
never start an embedded server), ``namespace``, ``topology``, ``source``,
``num_channels``, and optionally ``max_records_per_batch``, ``read_page_entries``
(stream entries of the first server-side read call of a partition, default 8;
later calls double or halve it, up to 4096, aiming at about 10,000 records per
call, since one entry holds the ids of one persist call, 1 to
``flush_batch_size`` of them), ``connect_timeout_s`` and ``outage_budget_s``
(default 300: every Redis command of the source, in the source runner and in
``read``, waits out an outage with backoff for up to that many seconds before
it raises; see :mod:`ftlayer.store.outage`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ftlayer.acker.batch_acks import BATCH_KEY_TTL_S, batch_tag
from ftlayer.acker.holds import CARRY_PREFIX, hold_lease_s
from ftlayer.config import FTConfig, parse_bool
from ftlayer.errors import ConfigError, FrameError, FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import check_name
from ftlayer.logs import logger_for
from ftlayer.records.chunks import CHUNK_KEY_BYTES, STATE_HEADER
from ftlayer.servers.process_server import resolved
from runtime.spark.admission import AvailableNowBase, max_rows, read_all, read_max_rows
from runtime.spark.arrow_codec import (
    SOURCE_SCHEMA_DDL,
    frames_to_record_batch,
    spans_to_record_batch,
    split_bad_frames,
)
from runtime.spark.batch_holds import HOLD_SET_MARGIN_S, BatchHolds
from runtime.spark.ft_offsets import START_ID, Position, compare_ids, parse_id
from runtime.spark.ft_offsets import max_id as _max_id
from runtime.spark.ft_offsets import min_id as _min_id
from runtime.spark.option_names import SourceOptionMap, camel_case
from runtime.spark.row_contract import SOURCE_ROW
from runtime.spark.worker_heap import freeze_worker_heap

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "FORMAT",
    "SOURCE_SCHEMA_DDL",
    "ChannelPartition",
    "FTSource",
    "FTSourceOptions",
    "FTStreamReader",
    "Offset",
    "channel_key",
    "compare_ids",
    "read_stream",
    "register",
    "source_options",
    "source_schema",
]

FORMAT = "ftlayer"
DEFAULT_READ_PAGE_ENTRIES = 8  # first page of a read; later pages adapt (see read())
MAX_READ_PAGE_ENTRIES = 4096
READ_TARGET_RECORDS = 10_000  # records per server-side read call that paging aims at
log = logger_for(__name__)
DEFAULT_OUTAGE_BUDGET_S = FTConfig().outage_budget_s
DEFAULT_MAX_BATCH_S = FTConfig().max_batch_s
# An offset: channel stream key ("ch<c>", "ch<c>s<shard>" with shards) -> Redis stream id ("<ms>-<seq>").
Offset = dict[str, str]

def source_schema() -> StructType:
    """The Spark schema of the FT source: :data:`runtime.spark.row_contract.SOURCE_ROW`'s."""
    return SOURCE_ROW.struct_type()


def channel_key(channel: int, shard: int = 0, num_shards: int = 1) -> str:
    """The offset key of a channel stream: ``"ch<c>"``, or ``"ch<c>s<shard>"`` for a source with
    several shards (each shard has its own stream per channel)."""
    return f"ch{channel}" if num_shards == 1 else f"ch{channel}s{shard}"


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


@dataclass(frozen=True)
class FTSourceOptions:
    """The FT source's options, parsed and validated. Picklable."""

    redis_url: str
    namespace: str
    topology: str
    source: str
    num_channels: int
    max_records_per_batch: int | None = None
    read_page_entries: int = DEFAULT_READ_PAGE_ENTRIES
    connect_timeout_s: float = 5.0
    outage_budget_s: float = DEFAULT_OUTAGE_BUDGET_S
    num_shards: int = 1
    freeze_worker_heap: bool = True  # FTConfig.freeze_worker_heap, applied in the read tasks
    max_batch_s: float = DEFAULT_MAX_BATCH_S  # FTConfig.max_batch_s: the longest hold of a batch
    hold_lease_s: float = 10.0  # how far one renewal moves a hold (ftlayer.acker.holds.hold_lease_s)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> FTSourceOptions:
        """Parse Spark's (string-valued) options, each under its camelCase or snake_case name in
        any case (``maxRecordsPerBatch`` = ``max_records_per_batch``); ConfigError names a bad one."""
        opts = SourceOptionMap(options, "FT source")

        def required(name: str) -> str:
            value = opts.get(name, "").strip()
            if not value:
                msg = f"FT source option {camel_case(name)!r} ({name}) is required (format {FORMAT!r})"
                raise ConfigError(msg)
            return value

        def integer(name: str, value: str, low: int, high: int) -> int:
            try:
                parsed = int(value.strip().replace("_", ""))
            except ValueError:
                parsed = low - 1
            if not low <= parsed <= high:
                msg = f"invalid FT source option {name}={value!r}: expected an integer from {low} to {high}"
                raise ConfigError(msg)
            return parsed

        url = required("redis_url")
        topology = check_name("topology", required("topology"))
        source = check_name("source", required("source"))
        num_channels = integer("num_channels", required("num_channels"), 1, 4096)
        raw_max = opts.get("max_records_per_batch", "").strip()
        max_records = integer("max_records_per_batch", raw_max, 1, 2**62) if raw_max else None
        raw_page = opts.get("read_page_entries", "").strip()
        page = DEFAULT_READ_PAGE_ENTRIES
        if raw_page:
            page = integer("read_page_entries", raw_page, 1, MAX_READ_PAGE_ENTRIES)
        def seconds(name: str, default: float) -> float:
            if not opts.get(name, "").strip():
                return default
            try:
                return float(opts[name])
            except ValueError as exc:
                msg = f"invalid FT source option {name}={opts[name]!r}: expected seconds"
                raise ConfigError(msg) from exc

        timeout = seconds("connect_timeout_s", 5.0)
        budget = seconds("outage_budget_s", DEFAULT_OUTAGE_BUDGET_S)
        raw_shards = opts.get("num_shards", "").strip()
        shards = integer("num_shards", raw_shards, 1, 64) if raw_shards else 1
        freeze = parse_bool("freeze_worker_heap", opts.get("freeze_worker_heap", "true"), "FT source options")
        max_batch = seconds("max_batch_s", DEFAULT_MAX_BATCH_S)
        lease = seconds("hold_lease_s", 10.0)
        if max_batch <= 0 or lease <= 0:
            msg = f"invalid FT source options max_batch_s={max_batch!r}, hold_lease_s={lease!r}: expected > 0"
            raise ConfigError(msg)
        parsed = cls(url, required("namespace"), topology, source, num_channels, max_records, page, timeout, budget,
                     shards, freeze, max_batch, lease)
        parsed.config()  # validates redis_url, namespace, the timeout and the budget
        return parsed

    def config(self) -> FTConfig:
        """The FTConfig the source's Redis handle is built from."""
        return FTConfig(
            redis_url=self.redis_url, namespace=self.namespace, connect_timeout_s=self.connect_timeout_s,
            outage_budget_s=self.outage_budget_s, num_shards=self.num_shards,
        )


class ChannelPartition(InputPartition):
    """Input partition ``channel`` of a micro-batch: stream ids in ``(start, end]`` of that channel's
    stream in each shard (``ranges``: ``(shard, start, end)``; one range for a one-shard source).
    ``tag`` names the micro-batch (``ftlayer.acker.batch_acks.batch_tag`` of its end offset): the read
    files what it read under it (the batch's hold set and, on the DataFrame path, its emitted ids)."""

    def __init__(self, channel: int, start: str, end: str,
                 more: Sequence[tuple[int, str, str]] = (), tag: str | None = None) -> None:
        super().__init__(channel)
        self.channel = channel
        self.start = start
        self.end = end
        self.ranges: list[tuple[int, str, str]] = [(0, start, end), *more]
        self.tag = tag


class FTStreamReader(DataSourceStreamReader, AvailableNowBase):  # type: ignore[misc]
    """Stream reader of one ftlayer source (see the module notes for offsets and processes)."""

    # the DataFrame path's reader (typed_source) settles each batch at Spark's commit: its read
    # tasks note the records of their range no longer pending (ftlayer.keyspace.keys ``dfs:<tag>``)
    NOTES_SKIPS = False

    def __init__(self, options: FTSourceOptions) -> None:
        self.opts = options
        self._layer: FTLayer | None = None
        self._checked = False
        self._target: Offset | None = None  # Trigger.AvailableNow: tails when the query started
        self._last_tails: Offset | None = None  # seen by the last latestOffset, for progress reports
        self._holds: BatchHolds | None = None  # driver side only: the running batch's hold
        self._carry: str | None = None  # driver side only: the hold of the unread rest of a cut entry

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_layer"] = None  # rebuilt (and reconnected) in the process that unpickles
        state["_checked"] = False
        state["_holds"] = None  # a thread of the source runner: never shipped to a read task
        state["_carry"] = None
        return state

    # --- Redis access ------------------------------------------------------------
    @property
    def layer(self) -> FTLayer:
        """This process's FTLayer of the source (client created on first use)."""
        if self._layer is None:
            o = self.opts
            # every command waits out a Redis outage: an error in latestOffset kills the query at once
            self._layer = FTLayer(o.config(), o.topology, o.source, num_channels=o.num_channels,
                                  outage_budget_s=o.outage_budget_s)
        return self._layer

    @property
    def channels(self) -> range:
        return range(self.opts.num_channels)

    @property
    def streams(self) -> list[tuple[int, int, str]]:
        """Every channel stream of every shard: ``(channel, shard, offset key)``."""
        n = self.layer.num_shards
        return [(c, k, channel_key(c, k, n)) for c in self.channels for k in range(n)]

    def _stream_name(self, channel: int, shard: int) -> str:
        return self.layer.shards[shard].store.keys.channel(channel)

    def _check_once(self) -> None:
        if not self._checked:
            self.layer.check_channels()
            self._checked = True

    def tails(self, *, trim_upto: Mapping[str, str] | None = None) -> Offset:
        """Every channel's last generated stream id (``"0-0"`` if none), in one round trip.

        With ``trim_upto`` (an offset), the same round trip first trims every
        channel stream up to it (see :meth:`commit`).
        """
        layer = self.layer
        streams = self.streams
        pipe = layer.client.pipeline(transaction=False)
        if trim_upto is not None:
            self._queue_trims(pipe, trim_upto)
        for c, k, _ in streams:
            pipe.xinfo_stream(self._stream_name(c, k))
        replies = pipe.execute(raise_on_error=False)
        out: Offset = {}
        for reply in replies[: len(replies) - len(streams)]:
            if isinstance(reply, Exception):
                raise reply
        for (_, _, key), reply in zip(streams, replies[-len(streams) :], strict=True):
            if isinstance(reply, Exception):
                if "no such key" not in str(reply).lower():
                    raise reply
                out[key] = START_ID
            else:
                out[key] = _text(reply.get("last-generated-id", START_ID))
        return out

    def _queue_trims(self, pipe: Any, upto: Mapping[str, str]) -> None:
        """Queue on ``pipe`` an exact ``XTRIM MINID`` of every channel stream to just after ``upto``
        (to just before its entry when ``upto`` ends inside an entry: the rest is still to read)."""
        for c, k, key in self.streams:
            last = upto[key]
            if last != START_ID:
                ms, seq = parse_id(last)
                minid = f"{ms}-{seq + 1}" if "@" not in last else f"{ms}-{seq}"
                pipe.xtrim(self._stream_name(c, k), minid=minid, approximate=False)

    def _check_offset(self, offset: Mapping[str, Any], what: str) -> None:
        expected = {key for _, _, key in self.streams}
        if "feed" in offset:
            msg = (f"the {what} offset in the checkpoint was written by an FT-off run (the feed source), not by "
                   f"FT source '{self.opts.topology}/{self.opts.source}': give this run its own checkpoint "
                   "location (a topology's FT-on and FT-off runs cannot share one)")
            raise ConfigError(msg)
        if set(offset) != expected:
            o = self.opts
            msg = (
                f"the {what} offset of FT source '{o.topology}/{o.source}' has channel streams "
                f"{sorted(offset)} but the source is read with num_channels={o.num_channels} and "
                f"num_shards={self.layer.num_shards}; a checkpoint cannot change either count"
            )
            raise ConfigError(msg)

    # --- DataSourceStreamReader -------------------------------------------------
    def initialOffset(self) -> Offset:
        """Every channel at ``"0-0"``: read each stream from its beginning."""
        return {key: START_ID for _, _, key in self.streams}

    def getDefaultReadLimit(self) -> Any:
        """``ReadMaxRows(max_records_per_batch)`` if that option is set, else read all available."""
        n = self.opts.max_records_per_batch
        return read_all() if n is None else read_max_rows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: remember the current tails; no batch reads past them."""
        self._check_once()
        self._target = self.tails()

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
            end = self.layer.store.ride_out(lambda: self._capped(start, uncapped, cap))
        return end

    def reportLatestOffset(self) -> Offset:
        """The tails, for the query's progress report (those the last ``latestOffset`` saw)."""
        return dict(self._last_tails) if self._last_tails is not None else self.tails()

    def _capped(self, start: Offset, end: Offset, max_rows: int) -> Offset:
        """Per channel stream, the records of ``(start, end]`` up to ``ceil(max_rows / streams)``: whole
        entries while they fit, then a position inside the entry where the share is reached
        (``runtime.spark.ft_offsets``), so one large persist call no longer makes one large batch."""
        streams = self.streams
        share = max(1, math.ceil(max_rows / len(streams)))
        page = min(share, 1024)  # every entry holds at least one record
        layer = self.layer
        capped = dict(end)
        pos = {k: start[k] for k in capped}
        counted = dict.fromkeys(capped, 0)
        open_ = [(c, s, k) for c, s, k in streams if compare_ids(end[k], start[k]) > 0]
        for c, s, k in list(open_):  # a start inside an entry: the rest of that entry first
            first = Position.parse(start[k])
            if first.chunk is None:
                continue
            cut, got = self._cut_entry(c, s, first.entry, share, first)
            if cut is not None:
                capped[k] = cut
                open_.remove((c, s, k))
            else:
                counted[k], pos[k] = got, first.entry
        while open_:
            pipe = layer.client.pipeline(transaction=False)
            for c, s, k in open_:
                after = "-" if pos[k] == START_ID else "(" + pos[k]
                pipe.xrange(self._stream_name(c, s), after, end[k], count=page)
            still_open: list[tuple[int, int, str]] = []
            for (c, s, k), entries in zip(open_, pipe.execute(), strict=True):
                done = len(entries) < page
                for entry_id, fields in entries:
                    n = int(fields.get(b"n", b"0"))
                    if counted[k] + n > share:  # the share ends inside this entry
                        cut, _ = self._cut_entry(c, s, _text(entry_id), share - counted[k])
                        if cut is not None:
                            capped[k], done = cut, True
                            break
                    pos[k] = _text(entry_id)
                    counted[k] += n
                    if counted[k] >= share:
                        done = True
                        break
                if capped[k] != end[k]:
                    continue
                if done or compare_ids(pos[k], end[k]) >= 0:
                    # trimmed ranges may yield fewer ids; an untouched stream keeps its start
                    capped[k] = pos[k] if counted[k] >= share else end[k]
                else:
                    still_open.append((c, s, k))
            open_ = still_open
        return capped

    def _entry_chunks(self, c: int, shard: int, entry: str) -> list[bytes]:
        """The chunk ids stream entry ``entry`` of channel ``c`` in ``shard`` lists, in order ([] if trimmed)."""
        found: Any = self.layer.client.xrange(self._stream_name(c, shard), entry, entry, count=1)
        blob: bytes = found[0][1].get(b"c", b"") if found else b""
        return [blob[i : i + CHUNK_KEY_BYTES] for i in range(0, len(blob) - CHUNK_KEY_BYTES + 1, CHUNK_KEY_BYTES)]

    def _cut_entry(self, c: int, shard: int, entry: str, need: int,
                   after: Position | None = None) -> tuple[str | None, int]:
        """The position inside stream entry ``entry`` after its first ``need`` records (those after
        ``after``, if it points into this entry), or ``(None, records there)`` if it has no more."""
        keys = self._entry_chunks(c, shard, entry)
        store = self.layer.shards[shard].store
        states: list[Any] = store.client.hmget(store.keys.chunks, keys) if keys else []
        begun = after is None
        total = 0
        for key, state in zip(keys, states, strict=True):
            first = 0
            if not begun:
                if after is None or key != after.chunk:
                    continue
                begun, first = True, after.index + 1
            n = STATE_HEADER.unpack_from(state)[3] if state else 0  # a chunk gone has nothing to read
            take = max(0, n - first)
            if total + take >= need and take > 0:
                index = first + (need - total) - 1
                return str(Position(entry, key, index)) if index < n - 1 or key != keys[-1] else entry, need
            total += take
        return None, total

    def partitions(self, start: Offset, end: Offset) -> Sequence[ChannelPartition]:
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
            out.append(ChannelPartition(c, start[keys[0]], end[keys[0]], more, tag=tag))
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
            keys = self.layer.store.ride_out(partial(self._entry_chunks, c, s, pos.entry))
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

    def read(self, partition: ChannelPartition) -> Iterator[Any]:  # type: ignore[override]
        """Arrow record batches (SOURCE_ROW) of the still-pending records of ``(start, end]`` of one
        channel, of each shard."""
        freeze_worker_heap(self.opts.freeze_worker_heap)
        tag = getattr(partition, "tag", None)
        for shard, after, until in partition.ranges:
            yield from self._read_range(partition.channel, shard, after, until, tag)

    def _read_range(self, c: int, shard: int, after: str, until: str, tag: str | None = None) -> Iterator[Any]:
        if compare_ids(until, after) <= 0:
            return
        layer = self.layer
        page = self.opts.read_page_entries
        hold_ttl_ms = int((self.opts.max_batch_s + HOLD_SET_MARGIN_S) * 1000)
        # the DataFrame path settles a batch's reads at Spark's commit: note what this read skips
        skips_ttl_ms = BATCH_KEY_TTL_S * 1000 if self.NOTES_SKIPS else None
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
            blob, starts, lengths, sids = batch.spans()
            if sids:
                yield from self._arrow(blob, starts, lengths, sids)
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

    def _arrow(self, blob: bytes, starts: list[int], lengths: list[int], sids: list[int]) -> list[Any]:
        """The Arrow batch of the frames read; one that fails its checks (a CRC mismatch) is
        failed in Redis for the dead-letter queue (by its place in its chunk) and left out, so
        the channel goes on."""
        try:
            return [spans_to_record_batch(blob, starts, lengths)]
        except FrameError:
            frames = [blob[s : s + n] for s, n in zip(starts, lengths, strict=True)]
            good, bad = split_bad_frames(frames)
            self.layer.fail_unreadable([(sids[i], f"unreadable frame: {reason}") for i, reason in bad])
            return [frames_to_record_batch(good)] if good else []

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


class FTSource(DataSource):
    """``format("ftlayer")``: the persisted records of one ftlayer source as a stream."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return source_schema()

    def streamReader(self, schema: StructType) -> FTStreamReader:
        if not SOURCE_ROW.same_struct(schema):
            msg = f"the FT source has the fixed schema {SOURCE_SCHEMA_DDL!r}; got {schema.simpleString()!r}"
            raise ConfigError(msg)
        return FTStreamReader(FTSourceOptions.parse(self.options))


REGISTERED_ATTR = "_ftlayer_format"  # set on a session once format "ftlayer" is registered in it


def register(spark: SparkSession) -> None:
    """Register :class:`FTSource` with the session (``format("ftlayer")``); safe to repeat.

    A session that already has the format keeps it: the typed source
    (``runtime.spark.typed_source``) registers a subclass that reads both schemas.
    """
    if getattr(spark, REGISTERED_ATTR, False):
        return
    spark.dataSource.register(FTSource)
    setattr(spark, REGISTERED_ATTR, True)


def source_options(config: FTConfig, topology: str, source: str, num_channels: int, *,
                   max_records_per_batch: int | None = None, read_page_entries: int | None = None) -> dict[str, str]:
    """The FT source's options for a resolved ``config`` (validated here, not in a Spark worker)."""
    options = {
        "redis_url": config.redis_url,
        "namespace": config.namespace,
        "topology": topology,
        "source": source,
        "num_channels": str(num_channels),
        "num_shards": str(config.num_shards),
        "connect_timeout_s": repr(config.connect_timeout_s),
        "outage_budget_s": repr(config.outage_budget_s),
        "freeze_worker_heap": str(config.freeze_worker_heap).lower(),
        "max_batch_s": repr(config.max_batch_s),
        "hold_lease_s": repr(hold_lease_s(config.rotation_interval_s)),
    }
    if max_records_per_batch is not None:
        options["max_records_per_batch"] = str(max_records_per_batch)
    if read_page_entries is not None:
        options["read_page_entries"] = str(read_page_entries)
    FTSourceOptions.parse(options)
    return options


def read_stream(
    spark: SparkSession,
    config: FTConfig,
    topology: str,
    source: str,
    num_channels: int,
    *,
    max_records_per_batch: int | None = None,
    read_page_entries: int | None = None,
) -> DataFrame:
    """A streaming DataFrame of the source's persisted records (registers the format first).

    ``config`` is resolved on the driver (an embedded server is started here if it
    has no URL), so executors connect to the same server by URL.
    """
    cfg = resolved(config)
    register(spark)
    options = source_options(cfg, topology, source, num_channels, max_records_per_batch=max_records_per_batch,
                             read_page_entries=read_page_entries)
    return spark.readStream.format(FORMAT).options(**options).load()

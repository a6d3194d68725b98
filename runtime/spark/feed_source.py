"""The FT-off source: a PySpark streaming data source over a driver-side :class:`runtime.driver.feed.Feed`.

``format("ftlayer_feed")`` gives the same columns as the FT source
(:data:`runtime.spark.row_contract.SOURCE_ROW`), so the same compiled topology
runs on either::

    sid long, cid long, key_hash long, origin long, replay int, channel int, payload binary

With FT off ``sid = cid = origin`` (one random id per record) and ``replay = 0``.

Offsets, partitions, commit
===========================

- An offset is ``{"feed": "<feed id>", "ch0": <seq>, "ch1": ...}``: per channel
  the feed's last sequence number read (0 = none). A different feed id (a new
  driver process) reads the new feed from its start; old ranges read nothing.
- ``partitions(start, end)`` returns exactly ``num_channels`` partitions and
  partition ``i`` reads channel ``i``, as with FT on (keyed routing unchanged).
- ``read()`` fetches ``(start, end]`` of its channel from the feed server over
  TCP (not Redis) in pages and yields Arrow record batches built on the
  received buffers without copying. A task retry re-reads the same rows while
  they are buffered, i.e. until committed.
- ``commit(end)`` drops the rows up to ``end`` from the feed. Spark (4.3) calls
  ``commit`` for batch N only when it plans batch N+1, so ``latestOffset(start)``
  also commits ``start`` in its round trip (Spark asks for data after ``start``
  only once the batches up to ``start`` completed), as the FT source does.

Admission control: with option ``max_records_per_batch`` the default read limit
is ``ReadMaxRows(n)`` and each channel advances by at most ``ceil(n /
num_channels)`` rows per batch. ``Trigger.AvailableNow`` is supported.

Which process runs what (pyspark 4.3): ``initialOffset``, ``latestOffset``,
``partitions`` and ``commit`` run in the query's long-lived
``python_streaming_source_runner`` process on the driver machine; ``read`` runs
in executor Python workers on a pickled reader. Neither is the user's driver
process that holds the feed, hence TCP. Connections are created lazily in the
process that uses them and never pickled.

Options (strings): ``address`` (``host:port``), ``token``, ``feed_id``,
``num_channels``, optionally ``max_records_per_batch`` and ``read_bytes``.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql.types import StructType

from ftlayer.errors import ConfigError
from runtime.driver.feed import DEFAULT_READ_BYTES, FeedServer, recv_message, send_message
from runtime.spark.admission import max_rows
from runtime.spark.channel_source import ChannelPartition, ChannelSource, ChannelStreamReader
from runtime.spark.option_names import SourceOptionMap
from runtime.spark.row_contract import SOURCE_ROW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMAT = "ftlayer_feed"
Offset = dict[str, Any]  # {"feed": feed id, "ch<c>": seq}; channel_source.Offset

def feed_schema() -> StructType:
    """The Spark schema: the FT source's (:data:`runtime.spark.row_contract.SOURCE_ROW`)."""
    return SOURCE_ROW.struct_type()


def _ch(c: int) -> str:
    return f"ch{c}"


@dataclass(frozen=True)
class FeedOptions:
    """The feed source's options, parsed. Picklable."""

    address: str
    token: str
    feed_id: str
    num_channels: int
    max_records_per_batch: int | None = None
    read_bytes: int = DEFAULT_READ_BYTES

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> FeedOptions:
        opts = SourceOptionMap({k: str(v).strip() for k, v in options.items()}, "feed source")
        for name in ("address", "token", "feed_id", "num_channels"):
            if not opts.get(name):
                msg = f"feed source option {name!r} is required (format {FORMAT!r})"
                raise ConfigError(msg)
        host, sep, port = opts["address"].rpartition(":")
        if not sep or not host or not port.isdigit():
            msg = f"invalid feed source option address={opts['address']!r}: expected host:port"
            raise ConfigError(msg)

        def integer(name: str, low: int) -> int | None:
            if not opts.get(name):
                return None
            try:
                value = int(opts[name])
            except ValueError:
                value = low - 1
            if value < low:
                msg = f"invalid feed source option {name}={opts[name]!r}: expected an integer >= {low}"
                raise ConfigError(msg)
            return value

        n = integer("num_channels", 1)
        assert n is not None
        return cls(opts["address"], opts["token"], opts["feed_id"], n, integer("max_records_per_batch", 1),
                   integer("read_bytes", 1) or DEFAULT_READ_BYTES)


class FeedClient:
    """A client connection to a :class:`FeedServer`; reconnects once if a call hits a dead connection."""

    def __init__(self, address: str, token: str, timeout_s: float = 60.0) -> None:
        host, _, port = address.rpartition(":")
        self._addr = (host, int(port))
        self._token = token
        self._timeout = timeout_s
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._addr, timeout=self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def call(self, op: str, *args: Any) -> Any:
        """Send one request and return its result (every operation is idempotent, so a retry is safe)."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._sock is None:
                        self._sock = self._connect()
                    send_message(self._sock, [self._token, op, *args])
                    ok, result = recv_message(self._sock)
                    break
                except OSError:
                    self.close_locked()
                    if attempt:
                        raise
            if not ok:
                msg = f"feed server {self._addr[0]}:{self._addr[1]} refused {op!r}: {result}"
                raise RuntimeError(msg)
            return result

    def close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


_clients: dict[tuple[int, str, str], FeedClient] = {}
_clients_lock = threading.Lock()


def client_for(address: str, token: str) -> FeedClient:
    """This process's cached client for a feed server (never pickled; created where it is used)."""
    key = (os.getpid(), address, token)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = FeedClient(address, token)
        return client


class FeedPartition(ChannelPartition):
    """Input partition ``channel``: seqs ``(start, end]`` of that channel of feed ``feed_id``."""

    def __init__(self, channel: int, feed_id: str, start: int, end: int) -> None:
        super().__init__(channel, start, end)
        self.feed_id = feed_id


def chunk_batch(chunk: Sequence[Any], channel: int, after: int, until: int) -> Any:
    """The rows of a wire chunk that fall in ``(after, until]``, as a RecordBatch (no copies)."""
    import pyarrow as pa

    first, count, sids, hashes, offsets, data = chunk
    schema = SOURCE_ROW.arrow_schema()

    def typed(name: str) -> Any:
        return schema.field(name).type

    sid = pa.Array.from_buffers(typed("sid"), count, [None, pa.py_buffer(sids)])
    kh = pa.Array.from_buffers(typed("key_hash"), count, [None, pa.py_buffer(hashes)])
    payload = pa.Array.from_buffers(typed("payload"), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    replay = pa.repeat(pa.scalar(0, typed("replay")), count)
    ch = pa.repeat(pa.scalar(channel, typed("channel")), count)
    columns = {"sid": sid, "cid": sid, "key_hash": kh, "origin": sid, "replay": replay, "channel": ch,
               "payload": payload}
    batch = pa.RecordBatch.from_arrays([columns[name] for name in SOURCE_ROW.names], schema=schema)
    lo = max(after + 1, first)
    hi = min(until, first + count - 1)
    return batch.slice(lo - first, max(0, hi - lo + 1))


class FeedStreamReader(ChannelStreamReader):
    """Stream reader of one feed (see the module notes)."""

    opts: FeedOptions

    def __init__(self, options: FeedOptions) -> None:
        super().__init__(options)

    @property
    def client(self) -> FeedClient:
        return client_for(self.opts.address, self.opts.token)

    def tails(self, *, trim_upto: Mapping[str, Any] | None = None) -> Offset:
        """The feed's tails (and its id), in one call; with ``trim_upto``, the feed first drops the
        rows up to it (if it names this feed)."""
        n = self.opts.num_channels
        trim = None
        if trim_upto is not None and trim_upto.get("feed") == self.opts.feed_id:
            trim = [int(trim_upto[_ch(c)]) for c in range(n)]
        feed_id, tails = self.client.call("tails", self.opts.feed_id, trim)
        out: Offset = {"feed": feed_id}
        out.update({_ch(c): int(tails[c]) for c in range(n)})
        return out

    def _check(self, offset: Mapping[str, Any], what: str) -> None:
        expected = {"feed"} | {_ch(c) for c in range(self.opts.num_channels)}
        if "feed" not in offset:
            msg = (f"the {what} offset in the checkpoint was not written by the FT-off feed source (it has "
                   f"keys {sorted(offset)}; an FT-on run writes those): give this run its own checkpoint "
                   "location (a topology's FT-on and FT-off runs cannot share one)")
            raise ConfigError(msg)
        if set(offset) != expected:
            msg = (f"the {what} offset of the feed source has keys {sorted(offset)}, expected "
                   f"{sorted(expected)}: a checkpoint cannot change the channel count")
            raise ConfigError(msg)

    def _from(self, start: Offset) -> Offset:
        """``start`` as positions in the current feed (an older feed's positions mean 'from the start')."""
        if start.get("feed") == self.opts.feed_id:
            return start
        return {"feed": self.opts.feed_id, **{_ch(c): 0 for c in range(self.opts.num_channels)}}

    def initialOffset(self) -> Offset:
        return {"feed": self.opts.feed_id, **{_ch(c): 0 for c in range(self.opts.num_channels)}}

    def latestOffset(self, start: Offset | None = None, limit: Any = None) -> Offset:
        """The tails (capped by the AvailableNow target and ``limit``); commits ``start`` first.

        Without admission control (pyspark 4.0: no arguments) it returns the tails.
        """
        if start is None:
            tails = self._last_tails = self.tails()
            return tails
        self._check(start, "start")
        tails = self._last_tails = self.tails(trim_upto=start)
        begin = self._from(start)
        share = None
        cap = max_rows(limit)
        if cap is not None:
            share = max(1, math.ceil(cap / self.opts.num_channels))
        end: Offset = {"feed": self.opts.feed_id}
        for c in range(self.opts.num_channels):
            k = _ch(c)
            tail = tails[k] if self._target is None else min(tails[k], self._target[k])
            if share is not None:
                tail = min(tail, begin[k] + share)
            end[k] = max(begin[k], tail)
        return end

    def partitions(self, start: Offset, end: Offset) -> Sequence[FeedPartition]:
        """One partition per channel, partition ``i`` = channel ``i`` (empty ranges included)."""
        self._check(start, "start")
        self._check(end, "end")
        feed_id = str(end["feed"])
        begin = start if start.get("feed") == feed_id else {_ch(c): 0 for c in range(self.opts.num_channels)}
        return [FeedPartition(c, feed_id, int(begin[_ch(c)]), int(end[_ch(c)]))
                for c in range(self.opts.num_channels)]

    def read(self, partition: FeedPartition) -> Iterator[Any]:  # type: ignore[override]
        """Record batches (SOURCE_ROW) of the buffered rows of ``(start, end]`` of one channel."""
        import pyarrow as pa

        c, after, until = partition.channel, partition.start, partition.end
        client = self.client
        while after < until:
            after, chunks = client.call("read", partition.feed_id, c, after, until, self.opts.read_bytes)
            if not chunks:
                return  # committed already, or an older feed: nothing buffered any more
            batches = [chunk_batch(ch, c, after, until) for ch in chunks]
            yield pa.concat_batches(batches) if len(batches) > 1 else batches[0]
            after = min(until, int(chunks[-1][0]) + int(chunks[-1][1]) - 1)

    def commit(self, end: Offset) -> None:
        """Spark committed everything up to ``end``: the feed drops those rows."""
        self._check(end, "committed")
        if end.get("feed") == self.opts.feed_id:
            self.client.call("commit", self.opts.feed_id, [int(end[_ch(c)]) for c in range(self.opts.num_channels)])


class FeedSource(ChannelSource):
    """``format("ftlayer_feed")``: the rows of a driver-side feed (FT off) as a stream."""

    FORMAT = FORMAT
    LABEL = "feed source"

    def streamReader(self, schema: StructType) -> FeedStreamReader:
        return cast("FeedStreamReader", super().streamReader(schema))

    def open_reader(self) -> FeedStreamReader:
        return FeedStreamReader(FeedOptions.parse(self.options))


def feed_host(spark: SparkSession) -> str:
    """Where a feed server should listen: 127.0.0.1 for a local master, else ``spark.driver.host``."""
    master = str(spark.conf.get("spark.master", "local") or "local")
    if master.startswith("local"):
        return "127.0.0.1"
    return str(spark.conf.get("spark.driver.host"))


def feed_options(server: FeedServer, *, max_records_per_batch: int | None = None) -> dict[str, str]:
    """The feed source's options for a started feed server (validated here, not in a Spark worker)."""
    options = {
        "address": server.address,
        "token": server.token,
        "feed_id": server.feed.feed_id,
        "num_channels": str(server.feed.num_channels),
    }
    if max_records_per_batch is not None:
        options["max_records_per_batch"] = str(max_records_per_batch)
    FeedOptions.parse(options)
    return options


def read_feed_stream(spark: SparkSession, server: FeedServer, *, max_records_per_batch: int | None = None) -> DataFrame:
    """A streaming DataFrame of a started feed server's rows (registers the format first)."""
    spark.dataSource.register(FeedSource)
    options = feed_options(server, max_records_per_batch=max_records_per_batch)
    return spark.readStream.format(FORMAT).options(**options).load()

"""The in-memory feed of FT status 'off': the driver hands source records to Spark with no persistence.

With ``FTConfig(status="off")`` the topology runs with no Redis at all: the
ingest thread (:class:`runtime.driver.ingest.Ingestor` with a :class:`FeedDestination`)
appends encoded records to a :class:`Feed` held in the user's driver process,
and the :mod:`runtime.spark.feed_source` streaming source reads them from there over
TCP, served by a :class:`FeedServer` thread. This is the cost baseline that FT
on is measured against.

What FT off promises: nothing beyond Spark's own behaviour. Records are never
acked, failed or replayed; a record whose operator raises ``FailRecord`` is
dropped (and counted by the task's ``NonFTHandler``); any other exception fails
the Spark task as usual. Records in the feed live only in the driver's memory:
if the driver process dies they are lost, and a restarted query starts a new
feed (a new ``feed id``): offsets of an old feed read nothing.

Feed. Per channel, rows get monotonically increasing sequence numbers from 1
(0 = nothing). The ingest thread appends a batch per channel as one *chunk*
whose columns are already in Arrow's buffer layout (little-endian int64 source
ids and key hashes, int32 payload offsets, payload bytes), so a read only slices
the chunk list and an executor builds Arrow arrays without copying. ``commit``
drops the chunks whose rows are all at or below the committed sequence.

Wire protocol (TCP, one connection per client process, requests answered in
order): each message is a 4-byte big-endian length and a msgpack body. A
request is ``[token, op, *args]``; the answer is ``[true, result]`` or
``[false, error text]``. Requests larger than :data:`MAX_REQUEST_BYTES` or with a
wrong token close the connection. msgpack decodes untrusted bytes safely
(nothing is executed), but the token is only a guard against accidental
cross-talk, not authentication: anyone who can reach the port and read the
query's options can read the feed. Operations, all idempotent:

- ``tails(feed_id, trim_upto | None)`` -> ``[feed_id, [last seq per channel]]``; with
  ``trim_upto`` (a list of seqs of the same feed id) it commits first.
- ``read(feed_id, channel, after, until, max_bytes)`` -> ``[after', chunks]``:
  ``after'`` is ``after`` raised to the committed seq (committed rows are
  gone), chunks overlap ``(after', until]`` as ``[first seq, count, sids,
  key_hashes, offsets, data]``, up to ``max_bytes`` (at least one chunk); the
  caller slices and asks again from the last seq it got. Another feed id
  reads nothing.
- ``commit(feed_id, [seq per channel])`` -> ``None``: drop rows up to each seq.

Binding: :class:`FeedServer` listens on 127.0.0.1 by default (a local master:
the source runner and executors run on the driver machine). With a cluster
master the executors must reach the driver, so the compiler binds to
``spark.driver.host``; that host and the chosen port (ephemeral by default)
must be reachable from the executors.
"""

from __future__ import annotations

import bisect
import contextlib
import hmac
import itertools
import os
import secrets
import socket
import socketserver
import struct
import sys
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from ftlayer.config import FTConfig

_LEN = struct.Struct(">I")
MAX_REQUEST_BYTES = 1 << 20  # requests are a few numbers
MAX_CHUNK_DATA_BYTES = 64 << 20  # payload bytes per chunk (Arrow binary offsets are int32)
DEFAULT_READ_BYTES = 32 << 20  # payload bytes per read answer


def _le(values: Sequence[int], code: str) -> bytes:
    arr = array(code, values)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


@dataclass(frozen=True)
class Chunk:
    """``count`` rows of one channel with seqs ``first .. first + count - 1``, in Arrow layout."""

    first: int
    count: int
    sids: bytes  # int64 per row, random (sid = cid = origin with FT off)
    hashes: bytes  # little-endian int64 key hash per row
    offsets: bytes  # little-endian int32, count + 1 offsets into data
    data: bytes  # the msgpack payloads, concatenated

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def wire(self) -> list[Any]:
        return [self.first, self.count, self.sids, self.hashes, self.offsets, self.data]


def encode_chunk(first: int, hashes: Sequence[int], payloads: Sequence[bytes]) -> Chunk:
    """A chunk of rows starting at seq ``first``; each row gets a random 64-bit id (nothing is acked)."""
    offsets = [0, *itertools.accumulate(len(p) for p in payloads)]
    n = len(payloads)
    return Chunk(first, n, os.urandom(8 * n), _le(hashes, "q"), _le(offsets, "i"), b"".join(payloads))


class Feed:
    """Per-channel buffers of rows not yet committed (thread-safe; see the module notes)."""

    def __init__(self, num_channels: int, feed_id: str | None = None) -> None:
        self.num_channels = num_channels
        self.feed_id = feed_id or secrets.token_hex(8)
        self._lock = threading.Lock()
        self._chunks: list[list[Chunk]] = [[] for _ in range(num_channels)]
        self._tail = [0] * num_channels
        self._committed = [0] * num_channels
        self._fed = 0
        self._buffered_bytes = 0
        self._reads = 0
        self._rows_served = 0

    def append(self, channel: int, hashes: Sequence[int], payloads: Sequence[bytes]) -> int:
        """Append rows to ``channel`` (one chunk per at most 64 MiB of payloads); returns the new tail."""
        start, last = 0, 0
        while start < len(payloads):
            end, size = start, 0
            while end < len(payloads) and (end == start or size + len(payloads[end]) <= MAX_CHUNK_DATA_BYTES):
                size += len(payloads[end])
                end += 1
            chunk = encode_chunk(0, hashes[start:end], payloads[start:end])
            with self._lock:
                chunk = replace(chunk, first=self._tail[channel] + 1)
                self._chunks[channel].append(chunk)
                self._tail[channel] = chunk.last
                self._fed += chunk.count
                self._buffered_bytes += len(chunk.data)
                last = chunk.last
            start = end
        return last

    def tails(self) -> list[int]:
        with self._lock:
            return list(self._tail)

    def read(
        self, channel: int, after: int, until: int, max_bytes: int = DEFAULT_READ_BYTES
    ) -> tuple[int, list[Chunk]]:
        """``(after', chunks)``: the chunks holding the rows of ``(after', until]``, up to ``max_bytes``.

        ``after'`` is ``after`` raised to the channel's committed seq: committed rows are gone.
        """
        out: list[Chunk] = []
        with self._lock:
            after = max(after, self._committed[channel])
            chunks = self._chunks[channel]
            i = max(0, bisect.bisect_right(chunks, after, key=lambda ch: ch.first) - 1)
            size = 0
            self._reads += 1
            for chunk in itertools.islice(chunks, i, None):
                if chunk.first > until or (out and size >= max_bytes):
                    break
                if chunk.last <= after:
                    continue
                out.append(chunk)
                size += len(chunk.data)
                self._rows_served += min(until, chunk.last) - max(after + 1, chunk.first) + 1
        return after, out

    def commit(self, upto: Sequence[int]) -> None:
        """Drop every row at or below ``upto[c]`` of channel ``c`` (never moves backwards)."""
        with self._lock:
            for c, upto_c in enumerate(upto[: self.num_channels]):
                seq = min(int(upto_c), self._tail[c])
                if seq <= self._committed[c]:
                    continue
                self._committed[c] = seq
                chunks = self._chunks[c]
                keep = 0
                while keep < len(chunks) and chunks[keep].last <= seq:
                    self._buffered_bytes -= len(chunks[keep].data)
                    keep += 1
                del chunks[:keep]

    def pending(self) -> int:
        """Rows appended and not yet committed."""
        with self._lock:
            return sum(t - c for t, c in zip(self._tail, self._committed, strict=True))

    def stats(self) -> dict[str, int]:
        """``ingested`` (rows appended), ``committed``, ``pending``, ``buffered_bytes``, ``reads``, ``rows_served``."""
        with self._lock:
            committed = sum(self._committed)
            return {
                "ingested": self._fed,
                "committed": committed,
                "pending": self._fed - committed,
                "buffered_bytes": self._buffered_bytes,
                "reads": self._reads,
                "rows_served": self._rows_served,
            }


# --- wire ---------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(min(n - len(buf), 1 << 20))
        if not got:
            msg = "feed connection closed"
            raise ConnectionError(msg)
        buf += got
    return bytes(buf)


def send_message(sock: socket.socket, body: Any) -> None:
    data = msgpack.packb(body, use_bin_type=True)
    if len(data) < 65536:
        sock.sendall(_LEN.pack(len(data)) + data)
    else:  # no copy of a large answer
        sock.sendall(_LEN.pack(len(data)))
        sock.sendall(data)


def recv_message(sock: socket.socket, max_bytes: int | None = None) -> Any:
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if max_bytes is not None and size > max_bytes:
        msg = f"feed message of {size} bytes is larger than {max_bytes}"
        raise ConnectionError(msg)
    return msgpack.unpackb(_recv_exact(sock, size), raw=False)


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        owner = self.server.owner
        owner.track(sock, True)
        try:
            while True:
                try:
                    req = recv_message(sock, MAX_REQUEST_BYTES)
                except (ValueError, msgpack.UnpackException):
                    return
                if not (isinstance(req, list) and len(req) >= 2 and isinstance(req[0], str)
                        and hmac.compare_digest(req[0].encode(), owner.token.encode())):
                    send_message(sock, [False, "bad feed request or token"])
                    return
                try:
                    reply = [True, owner.dispatch(req[1], req[2:])]
                except Exception as exc:  # a bad request gets an error answer, the server lives on
                    reply = [False, f"{type(exc).__name__}: {exc}"]
                send_message(sock, reply)
        except OSError:  # the client went away (ConnectionError included)
            return
        finally:
            owner.track(sock, False)


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: FeedServer


class FeedServer:
    """Serves one :class:`Feed` over TCP from a daemon thread of the driver (see the module notes)."""

    def __init__(self, feed: Feed, *, name: str = "feed", host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None) -> None:
        self.feed = feed
        self.name = name
        self.token = token or secrets.token_hex(16)
        self._bind = (host, port)
        self._server: _TCPServer | None = None
        self._thread: threading.Thread | None = None
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """``host:port`` the server listens on (after :meth:`start`)."""
        assert self._server is not None, "FeedServer.start() first"
        return f"{self._bind[0]}:{self._server.server_address[1]}"

    def track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._socks.add(sock)
            else:
                self._socks.discard(sock)

    def dispatch(self, op: str, args: list[Any]) -> Any:
        feed = self.feed
        if op == "tails":
            feed_id, trim = args
            if trim is not None and feed_id == feed.feed_id:
                feed.commit(trim)
            return [feed.feed_id, feed.tails()]
        if op == "read":
            feed_id, channel, after, until, max_bytes = args
            if feed_id != feed.feed_id:
                return [until, []]
            after, chunks = feed.read(int(channel), int(after), int(until), int(max_bytes))
            return [after, [c.wire() for c in chunks]]
        if op == "commit":
            feed_id, upto = args
            if feed_id == feed.feed_id:
                feed.commit(upto)
            return None
        msg = f"unknown feed operation {op!r}"
        raise ValueError(msg)

    def start(self) -> FeedServer:
        server = _TCPServer(self._bind, _Handler)
        server.owner = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=f"ftlayer-feed-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every client connection; buffered rows are dropped with the feed."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            socks, self._socks = list(self._socks), set()
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._server = None


# --- ingest side --------------------------------------------------------------------
class FeedDestination:
    """Where :class:`runtime.driver.ingest.Ingestor` puts a source's batches with FT off: the feed.

    Each record gets one random id used as sid, cid and origin (nothing is
    acked, so ids only keep the row layout of FT on; they are not checked for
    0 or collisions). Backpressure counts rows appended and not yet committed.
    """

    def __init__(self, feed: Feed, config: FTConfig, label: str = "feed") -> None:
        self.feed = feed
        self.num_channels = feed.num_channels
        self.batch_size = min(config.flush_batch_size, config.ingest_batch_records)
        self.max_pending = config.max_pending
        self.label = label
        self.rejected = 0

    def put(self, payloads: list[bytes], hashes: Sequence[int], channels: Sequence[int], columns: Any = None) -> None:
        # ingest may hand numpy arrays over: the loop below steps per row, cheaper over Python ints
        hashes = hashes if isinstance(hashes, list) else hashes.tolist()  # type: ignore[attr-defined]
        channels = channels if isinstance(channels, list) else channels.tolist()  # type: ignore[attr-defined]
        per: dict[int, tuple[list[int], list[bytes]]] = {}
        for payload, h, ch in zip(payloads, hashes, channels, strict=True):
            hs, out = per.setdefault(ch, ([], []))
            hs.append(h)
            out.append(payload)
        for ch, (hs, out) in sorted(per.items()):
            self.feed.append(ch, hs, out)

    def reject(self, value: Any, reason: str) -> None:
        """FT off has no dead-letter queue: the record is dropped (the ingestor logs and counts it)."""
        self.rejected += 1

    def pending_count(self) -> int:
        return self.feed.pending()


class FeedProgress:
    """The progress of an FT-off query: rows fed vs rows committed by Spark, per source."""

    def __init__(self, servers: Sequence[FeedServer], dropped: Sequence[Any] = ()) -> None:
        self.servers = list(servers)
        self.dropped = list(dropped)  # per source: Spark accumulators of records dropped by FailRecord

    def stats(self) -> dict[str, dict[str, int]]:
        """Per source: the feed's counters plus ``dropped_fail_record`` (records a ``FailRecord``
        dropped; FT off cannot replay them), counted when their Spark task completed."""
        out = {s.name: s.feed.stats() for s in self.servers}
        for server, acc in zip(self.servers, self.dropped, strict=False):
            out[server.name]["dropped_fail_record"] = int(acc.value)
        return out

    def settled(self) -> bool:
        """Every fed row was committed: the batches holding them completed (sink written)."""
        return all(s.feed.pending() == 0 for s in self.servers)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

"""Every Redis key template, in one place (docs/architecture.md follows a record through them).

All keys of a source with one shard (``num_shards = 1``, the default) live under
``<namespace>:{<topology>/<source>}:``. The braces are a Redis Cluster hash tag:
every key of the source maps to one slot, so each server-side script touches one
slot. With ``num_shards`` N > 1 the source's records are spread over N virtual
shards, each with every key below but ``meta`` under its own tag
``<namespace>:{<tag of shard k>}:`` (``ftlayer.keyspace.shard_tags.shard_tags``: chosen so the
shards spread evenly over a cluster's primaries), and a record lives in the shard
its id names (``ftlayer.records.chunks.shard_of``). ``meta`` stays under the source's own
tag, where a reader finds ``num_shards`` before it knows the shards.

================  ======  ===============================================================
key suffix        type    contents
================  ======  ===============================================================
``ck``            hash    chunk id (6 bytes, ``ftlayer.records.chunks``) -> chunk state: bucket gen
                          u32 | stream-entry gen u32 | channel u16 | records n u16 | still
                          pending u16 | with a partial XOR u16 | flags u8 | settled bitmap
                          (bit i: record i completed, failed, or a hole). Present while any
                          record of the chunk is pending; deleted with its last one
``ci``            hash    chunk id -> n x 8-byte initial ack values (the records' current ids)
``cf``            hash    chunk id -> the records' frames in index order (4 zero bytes for a hole),
                          then, if its writer encoded them, their CRC-32 (``ftlayer.records.chunk_crc``)
``xv``            hash    source_record_id (8 bytes) -> current ack value (8), only for a record
                          whose tree was flushed in parts (split over tasks); deleted when it settles
``live``          string  records pending now (the sum of the chunks' pending counts)
``gen``           string  current bucket generation (rotations so far)
``bkt``           list    the timeout buckets of every generation, in generation order:
                          one element per persist call or re-filing, bucket gen (u32) + packed
                          6-byte chunk ids. Elements of buckets whose chunks all settled leave
                          from the head
``bcnt``          hash    gen -> chunks of that bucket still pending; at 0 the count is deleted
                          and the bucket's elements may leave ``bkt``
``gtime``         hash    gen -> ms when that bucket opened (written by ``rotate``; gen 0 at
                          register); only gens >= current - num_buckets are kept. Feeds
                          the oldest-pending age of ``ftlayer status``
``expq``          list    generations expired by ``rotate`` and not yet scanned
``ch:<c>``        stream  channel c: entries ``c`` = packed 6-byte chunk ids, ``g`` = bucket gen
                          when written, ``n`` = records; in persist order; the FT source reads
                          these; trimmed after Spark commits
``rd``            hash    channel -> ``"<entry gen> <stream id>"`` of the newest entry a
                          reader has read (the read watermark): chunks up to it were
                          handed to a task; a timeout re-files the others instead of failing
``failed``        hash    failed source_record_id -> fail time ms (double) | reason length
                          (u16; top bit set: dead-letter without replays) | reason | frame
``due``           zset    failed source_record_id scored by its replay-due time (ms)
``dlq``           stream  dead letters: origin, sid, replay count, reason, time, frame
``rpl``           hash    a record that timed out and was replayed: old sid -> new sid (8) |
                          replay time ms (double); so a DataFrame batch that commits after its
                          records timed out settles their copies (``BATCH_SETTLE``); field
                          ``~`` holds the sweep cursor; links older than a day are swept,
                          and the hash expires a day after its last link
``stats``         hash    counters: persisted, acked, failed_explicit, failed_timeout,
                          replayed, dead_lettered, requeued, late_deltas, duplicate_flushes,
                          refiled_unread, refiled_held, late_completions
``meta``          hash    num_channels, num_shards, format version (3; any other is refused
                          on start, see ``ftlayer.store.layout_version``), created time; under the source's
                          own tag whatever the shard count
``lease``         string  owner token of the rotator lease (with PX expiry)
``brk``           hash    the sink breaker (``ftlayer.acker.breaker``): query, since_ms, until_ms,
                          failures, error while a batch's write fails and is retried; under
                          the source's own tag; deleted when a write succeeds
``tok:<batch>``   hash    applied flush tokens of one micro-batch of one query (``<query
                          id>/<batch id>``): task -> 1; deleted when the batch commits,
                          PX expiry as a safety net (``ftlayer.acker.flush_tokens``)
``tok:dl:<sid>``   string  the dlq entry id of a record dead-lettered by ingest (retry guard)
``tok:p:<hash>``  string  a PERSIST call was applied (``<hash>``: xxh64 of its input; PX expiry):
                          a retried call files nothing, even after its records were acked
``dfb:<tag>``     list    DataFrame path: the records that the read tasks of the micro-batch
                          ``tag`` emitted (``tag``: ``ftlayer.acker.batch_acks.batch_tag`` of the
                          batch's end offset), as [chunk id 6][bitmap length u16][bitmap] per
                          chunk (PX expiry); acked and emptied once Spark committed the batch,
                          or failed by an acking point whose write failed
``dfs:<tag>``     hash    DataFrame path, the read notes of batch ``tag`` (READ_CHANNEL): chunk
                          id -> bitmap of the records of that chunk a read found no longer
                          pending (``*``: the chunk was gone); ``r<channel>`` -> the reads of
                          that partition; ``n<chunk id>`` -> channel * 2^24 + the reads that
                          returned the chunk. BATCH_SETTLE completes late only what every read
                          handed on (PX expiry); deleted with ``dfb:<tag>``
``holds``         hash    running micro-batches: ``tag`` -> ``"<deadline ms> <started ms>"``;
                          a timeout of a chunk in ``hld:<tag>`` falls due while the deadline
                          lies ahead is postponed (``ftlayer.acker.holds``)
``hld:<tag>``     set     the chunk ids the read tasks of batch ``tag`` received (PX expiry);
                          deleted with the hold
================  ======  ===============================================================

Namespace-level (no hash tag): ``<namespace>:sources`` (set of ``topology/source``)
and ``<namespace>:owner`` (who created the namespace: JSON ``{"created_ms": ..., "by":
"ftlayer"}``, set once by the first source's registration; the CLI's destructive
commands refuse a namespace without it unless ``--force``).
``<namespace>:dfq:<query id>:<batch id>`` (set of ``"topology/source tag"`` that the DataFrame
path's read tasks of that micro-batch filed under; PX expiry) tells an acking point or the
commit listener which sources' ``dfb:<tag>`` keys belong to a batch.
``<namespace>:dfk:<token>`` (the same, for a batch read under a batch token instead: on Spark
Connect the read tasks a ``foreachBatch`` function starts carry no query id, only the job tag
the acking point set, ``runtime.spark.connect``; PX expiry).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from ftlayer.errors import ConfigError
from ftlayer.keyspace.shard_tags import shard_tags

#: Version of the Redis layout these key names describe (``ftlayer.store.layout_version`` refuses any other).
FORMAT_VERSION = 3

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def check_name(kind: str, name: str) -> str:
    """Validate a topology or source name (it becomes part of every key)."""
    if not _NAME_RE.match(name):
        msg = f"invalid {kind} name {name!r}: expected 1-64 letters, digits, '_', '.' or '-'"
        raise ConfigError(msg)
    return name


@dataclass(frozen=True)
class SourceKeys:
    """Key names of one shard of one source (shard 0 of 1: the whole source). Picklable; cheap to build."""

    namespace: str
    topology: str
    source: str
    shard: int = 0
    num_shards: int = 1

    def __post_init__(self) -> None:
        check_name("topology", self.topology)
        check_name("source", self.source)
        if not 0 <= self.shard < self.num_shards:
            msg = f"shard {self.shard} out of range 0..{self.num_shards - 1}"
            raise ConfigError(msg)

    @property
    def tag(self) -> str:
        """This shard's hash tag (braces excluded): ``<topology>/<source>`` when the source has one shard."""
        base = f"{self.topology}/{self.source}"
        return base if self.num_shards == 1 else shard_tags(base, self.num_shards)[self.shard]

    @property
    def prefix(self) -> str:
        """``<namespace>:{<tag>}:``; every key of the shard starts with it."""
        return f"{self.namespace}:{{{self.tag}}}:"

    @property
    def source_prefix(self) -> str:
        """``<namespace>:{<topology>/<source>}:``, where ``meta`` lives whatever the shard count."""
        return f"{self.namespace}:{{{self.topology}/{self.source}}}:"

    def for_shard(self, shard: int) -> SourceKeys:
        """The keys of another shard of the same source."""
        return dataclasses.replace(self, shard=shard)

    def key(self, suffix: str) -> str:
        """The full name of one key of this source."""
        return self.prefix + suffix

    @property
    def chunks(self) -> str:
        """``ck``: chunk id -> chunk state (header and settled bitmap)."""
        return self.key("ck")

    @property
    def chunk_acks(self) -> str:
        """``ci``: chunk id -> the records' initial ack values."""
        return self.key("ci")

    @property
    def chunk_frames(self) -> str:
        """``cf``: chunk id -> the records' frames."""
        return self.key("cf")

    @property
    def partials(self) -> str:
        """``xv``: source record id -> ack value, for trees flushed in parts."""
        return self.key("xv")

    @property
    def live(self) -> str:
        """``live``: records pending now."""
        return self.key("live")

    @property
    def gen(self) -> str:
        return self.key("gen")

    @property
    def bcnt(self) -> str:
        return self.key("bcnt")

    @property
    def expq(self) -> str:
        return self.key("expq")

    @property
    def failed(self) -> str:
        return self.key("failed")

    @property
    def due(self) -> str:
        return self.key("due")

    @property
    def dlq(self) -> str:
        return self.key("dlq")

    @property
    def replaced(self) -> str:
        """Timed-out records replayed under a new id: old sid -> new sid (see ``BATCH_SETTLE``)."""
        return self.key("rpl")

    @property
    def stats(self) -> str:
        return self.key("stats")

    @property
    def meta(self) -> str:
        """The source's ``meta`` (under its own tag, not the shard's: see the module notes)."""
        return self.source_prefix + "meta"

    @property
    def lease(self) -> str:
        return self.key("lease")

    @property
    def breaker(self) -> str:
        """The source's sink breaker (``ftlayer.acker.breaker``), under its own tag like ``meta``."""
        return self.source_prefix + "brk"

    @property
    def read_marks(self) -> str:
        return self.key("rd")

    @property
    def buckets(self) -> str:
        return self.key("bkt")

    def channel(self, channel: int) -> str:
        return self.key(f"ch:{channel}")

    def token(self, token: str) -> str:
        return self.key(f"tok:{token}")

    def batch_reads(self, tag: str) -> str:
        """Ids emitted by the read tasks of the micro-batch ``tag`` (DataFrame path)."""
        return self.key(f"dfb:{check_name('batch tag', tag)}")

    def batch_skips(self, tag: str) -> str:
        """``dfs:<tag>``: the read notes of the micro-batch ``tag`` (DataFrame path): what its reads did not hand on."""
        return self.key(f"dfs:{check_name('batch tag', tag)}")

    @property
    def holds(self) -> str:
        """``holds``: running micro-batches (tag -> deadline and start, ms)."""
        return self.key("holds")

    def held(self, tag: str) -> str:
        """``hld:<tag>``: the chunk ids the read tasks of batch ``tag`` received."""
        return self.key(f"hld:{check_name('batch tag', tag)}")


def sources_key(namespace: str) -> str:
    """Set of ``topology/source`` names registered in the namespace."""
    return f"{namespace}:sources"


def owner_key(namespace: str) -> str:
    """Who created the namespace (a token written once)."""
    return f"{namespace}:owner"


def query_batch_key(namespace: str, query_id: str, batch_id: int) -> str:
    """Set of ``"topology/source tag"`` a micro-batch of a streaming query read (DataFrame path)."""
    return f"{namespace}:dfq:{check_name('query id', query_id)}:{int(batch_id)}"


def token_batch_key(namespace: str, token: str) -> str:
    """Set of ``"topology/source tag"`` the read tasks of one acking call read under batch token
    ``token`` (DataFrame path on Spark Connect; ``runtime.spark.connect``)."""
    return f"{namespace}:dfk:{check_name('batch token', token)}"

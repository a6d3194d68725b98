"""The topology API: wrap sources, operators and sinks; compile to one streaming query.

::

    topo = Topology("clicks", FTConfig.load())
    src = topo.source("events", click_generator(), key=lambda e: e["user"])
    out = src.map(parse).filter(valid).key_by(lambda e: e["user"]).map(enrich)
    out.sink(JsonLinesSink("/data/out"))          # acks after the write
    query = topo.start(spark)                      # FTQuery around a StreamingQuery
    query.await_drained(60)                        # every record acked or dead-lettered

Compilation. Each source becomes an ingest thread on the driver (persist before
visible) and an FT source DataFrame (partition i reads channel i). Runs of
``map``/``flat_map``/``filter`` fuse into one ``mapInArrow`` stage. ``key_by``
ends a stage: the stage computes the key hash and channel, and the exchange
puts channel c in Spark partition c exactly, so every record of a key,
replays included, is processed in the partition that owns the key. A stream
consumed by several operators fans out: each consumer reads its own copy
with its own child id (the Storm/original-design rule that every emitted
record has its own id). The sink is the last stage. A driver-side FT service
rotates timeout buckets and replays failures; it stops with the query.

With ``FTConfig(status="off")`` the same program runs with no FT and no Redis:
ingest appends to an in-memory feed on the driver (:mod:`runtime.feed`), read
by the ``ftlayer_feed`` source (same columns and partitions), with
``NonFTHandler`` s and no FT service. It promises nothing beyond Spark's own
behaviour; records in the feed are lost if the driver dies.

Operator ids and stage ids are assigned in construction order, so the same
program gives the same child ids after a driver restart.
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.connection import resolved
from ftlayer.errors import TopologyError
from ftlayer.keys import check_name
from ftlayer.layer import FTLayer
from ftlayer.service import FTService
from runtime.feed import Feed, FeedDestination, FeedProgress, FeedServer
from runtime.feed_source import feed_host
from runtime.ingest import BatchDestination, Ingestor
from runtime.observe import TopologyObservers
from runtime.operators import ROW_SCHEMA, Fanout, Op, Stage, StatefulStage, TaskEnv
from runtime.query import DriverSinkBatch, FTProgress, FTQuery, Progress
from runtime.session_conf import effective_config
from runtime.sinks import CallableSink, ExecutorSink, ForeachBatchSink, RedisHashSink, SinkStage
from runtime.trigger import Trigger, trigger_from

__all__ = ["Compiler", "FTQuery", "Stream", "Topology"]

FANOUT_OP_BASE = 1 << 20


@dataclass(eq=False)
class Node:
    """A vertex of the logical graph."""

    node_id: int
    parents: list[Node]
    consumers: list[Node] = field(default_factory=list)


@dataclass(eq=False)
class SourceNode(Node):
    name: str = ""
    source: Any = None
    key: Callable[[Any], Any] | None = None
    index: int = 0


@dataclass(eq=False)
class OpNode(Node):
    op: Op | None = None


@dataclass(eq=False)
class KeyByNode(Node):
    key: Callable[[Any], Any] | None = None


@dataclass(eq=False)
class StateNode(Node):
    fn: Callable[[dict[str, Any], Any], Any] | None = None
    name: str = ""


@dataclass(eq=False)
class UnionNode(Node):
    pass


@dataclass(eq=False)
class SinkNode(Node):
    sink: Any = None


class Stream:
    """A stream of records in a topology; every method returns a new Stream."""

    def __init__(self, topology: Topology, node: Node) -> None:
        self._topology = topology
        self._node = node

    def _op(self, kind: str, fn: Callable[[Any], Any]) -> Stream:
        return Stream(self._topology, self._topology._add(OpNode, [self._node], op_kind=(kind, fn)))

    def map(self, fn: Callable[[Any], Any]) -> Stream:
        """One output per input."""
        return self._op("map", fn)

    def flat_map(self, fn: Callable[[Any], Any]) -> Stream:
        """Zero or more outputs per input (``fn`` returns an iterable)."""
        return self._op("flat_map", fn)

    def filter(self, fn: Callable[[Any], bool]) -> Stream:
        """Keep the inputs for which ``fn`` is true; the others are acked with no output."""
        return self._op("filter", fn)

    def key_by(self, key: Callable[[Any], Any]) -> Stream:
        """Route by ``key``: channel = pmod(xxhash64(key), n), Spark partition = channel."""
        return Stream(self._topology, self._topology._add(KeyByNode, [self._node], key=key))

    def map_with_state(self, fn: Callable[[dict[str, Any], Any], Any], *, name: str | None = None) -> Stream:
        """Keyed state: right after ``key_by``, ``fn(state, value)`` returns an iterable of outputs and
        may change ``state``, the key's dict, kept in Redis under ``name`` (default ``op<N>``, N =
        the operator's position); see runtime.keyed_state for its at-least-once contract."""
        if not isinstance(self._node, KeyByNode):
            msg = f"topology {self._topology.name!r}: map_with_state must directly follow key_by"
            raise TopologyError(msg)
        state = check_name("state", name or f"op{len(self._topology._nodes)}")
        return Stream(self._topology, self._topology._add(StateNode, [self._node], fn=fn, name=state))

    def union(self, *others: Stream) -> Stream:
        """Records of this stream and the others."""
        return Stream(self._topology, self._topology._add(UnionNode, [self._node, *(o._node for o in others)]))

    def sink(self, sink: ExecutorSink | ForeachBatchSink | Callable[[list[Any]], Any]) -> None:
        """End the stream in a sink; a plain callable becomes a :class:`CallableSink`."""
        if not isinstance(sink, (ExecutorSink, ForeachBatchSink)):
            sink = CallableSink(sink)
        self._topology._add(SinkNode, [self._node], sink=sink)


class Topology:
    """A named dataflow of FT-wrapped sources, operators and one sink."""

    def __init__(self, name: str, config: FTConfig | None = None) -> None:
        self.name = check_name("topology", name)
        self.config = config or FTConfig.load()
        self._nodes: list[Node] = []
        self._sources: list[SourceNode] = []

    def _add(self, cls: type[Node], parents: list[Node], **kw: Any) -> Node:
        node_id = len(self._nodes)
        if cls is OpNode:
            kind, fn = kw.pop("op_kind")
            node: Node = OpNode(node_id, parents, op=Op(kind, fn, node_id))
        else:
            node = cls(node_id, parents, **kw)
        for p in parents:
            if isinstance(p, SinkNode):
                msg = f"topology {self.name!r}: nothing can follow a sink"
                raise TopologyError(msg)
            p.consumers.append(node)
        self._nodes.append(node)
        return node

    def source(self, name: str, source: Any, *, key: Callable[[Any], Any] | None = None) -> Stream:
        """Wrap a user source (iterable, callable, or open/poll/close object); ``key`` routes it."""
        check_name("source", name)
        if any(s.name == name for s in self._sources):
            msg = f"topology {self.name!r} already has a source named {name!r}"
            raise TopologyError(msg)
        node = self._add(SourceNode, [], name=name, source=source, key=key, index=len(self._sources))
        assert isinstance(node, SourceNode)
        self._sources.append(node)
        return Stream(self, node)

    def start(
        self,
        spark: Any,
        *,
        checkpoint_location: str | None = None,
        trigger_interval_s: float | None = None,
        max_records_per_batch: int | None = None,
        processingTime: str | None = None,  # PySpark trigger() keywords
        availableNow: bool = False,
        once: bool = False,
        query_name: str | None = None,
    ) -> FTQuery:
        """Start ingest, the FT service and the streaming query; the FTQuery handle works like a StreamingQuery.

        Trigger: at most one of ``processingTime`` (default ``"500 milliseconds"``),
        ``availableNow``, ``once`` or the float ``trigger_interval_s`` (see
        :mod:`runtime.trigger`; with a finite trigger, ingest runs to the end of every source
        before the query starts). ``query_name`` defaults to ``ftlayer-<topology>``;
        ``checkpoint_location`` to a new temporary directory.

        Config: the session's ``spark.ftlayer.*`` keys are applied to every option not set in
        code (:meth:`ftlayer.config.FTConfig.with_spark_conf`); the result is ``FTQuery.config``.
        """
        trigger = trigger_from(processing_time=processingTime, available_now=availableNow, once=once,
                               trigger_interval_s=trigger_interval_s)
        name = query_name if query_name is not None else f"ftlayer-{self.name}"
        if not name.strip():
            msg = f"topology {self.name!r}: query_name must not be empty"
            raise TopologyError(msg)
        return Compiler(self, spark).start(checkpoint_location, trigger, max_records_per_batch, name)


def _await_ingest(topology: str, ingestors: list[Ingestor], trigger: Trigger, poll_s: float = 0.05) -> None:
    """Finite trigger: wait until ingest reached the end of every source (see :mod:`runtime.trigger`).

    Raises :class:`TopologyError` when ingest waits on backpressure (``max_pending`` records
    pending), which no query runs to relieve yet. An unbounded source never ends: don't use a
    finite trigger with one.
    """
    held_since: float | None = None
    while not all(i.done for i in ingestors):
        held = [i for i in ingestors if not i.done and i.destination.pending_count() >= i.max_pending]
        if not held:
            held_since = None
        elif held_since is None:
            held_since = time.monotonic()
        elif time.monotonic() - held_since >= 2.0:  # held for a while, not just the last batch landing
            ing = held[0]
            msg = (
                f"topology {topology!r}: {trigger} processes what is persisted when the query starts, but "
                f"ingest of {ing.destination.label} is held by backpressure ({ing.max_pending} records "
                f"pending, max_pending): raise max_pending above the source's size or use processingTime"
            )
            raise TopologyError(msg)
        time.sleep(poll_s)


class Compiler:
    """Turns the logical graph into DataFrames (see the module docstring)."""

    def __init__(self, topology: Topology, spark: Any) -> None:
        self.topology = topology
        self.spark = spark
        # spark.ftlayer.* of the session beat file and env, not options set in code (runtime.session_conf)
        cfg = effective_config(topology.config, spark)
        # FT off: no Redis URL is resolved, so no embedded server is started either
        cfg = resolved(cfg) if cfg.ft_on else cfg
        self.config = cfg
        self.n = cfg.num_channels
        names = tuple(s.name for s in topology._sources)
        # FT off: FailRecord drops happen in executors; accumulators bring the counts back
        dropped = () if cfg.ft_on else tuple(spark.sparkContext.accumulator(0) for _ in names)
        self.env = TaskEnv(cfg, topology.name, names, self.n, dropped)
        self._stage_ids = 0
        self._max_records: int | None = None
        self._feeds: list[FeedServer] = []

    def _next_stage(self) -> int:
        self._stage_ids += 1
        return self._stage_ids

    @functools.cache  # noqa: B019 - one compiler per start(); memoises shared sub-plans
    def df_for(self, node: Node) -> Any:
        from pyspark.sql import functions as F

        from partitioners.spark_exact import exact_repartition
        from runtime.feed_source import read_feed_stream
        from runtime.ft_source import read_stream

        if isinstance(node, SourceNode):
            if self.config.ft_on:
                df = read_stream(self.spark, self.config, self.topology.name, node.name, self.n,
                                 max_records_per_batch=self._max_records)
            else:
                df = read_feed_stream(self.spark, self._feeds[node.index], max_records_per_batch=self._max_records)
            return df.select(F.lit(node.index).cast("int").alias("src"), "sid", "cid", "origin",
                             "key_hash", "channel", "payload", F.lit(0).cast("long").alias("delta"))
        if isinstance(node, OpNode):
            return self.stage_df(node, key=None)
        if isinstance(node, KeyByNode):
            parent = node.parents[0]
            if isinstance(parent, OpNode) and len(parent.consumers) == 1:
                keyed = self.stage_df(parent, key=node.key)
            else:
                keyed = self.pass_through(parent, node, key=node.key)
            return exact_repartition(keyed, "channel", self.n)
        if isinstance(node, StateNode):
            keyed = node.parents[0]
            assert isinstance(keyed, KeyByNode) and keyed.key is not None and node.fn is not None
            stage = StatefulStage(self.env, self._next_stage(), keyed.key, node.fn, node.name)
            return self.input_df(keyed, node).mapInArrow(stage, ROW_SCHEMA)
        if isinstance(node, UnionNode):
            dfs = [self.input_df(p, node) for p in node.parents]
            return functools.reduce(lambda a, b: a.unionByName(b), dfs)
        msg = f"cannot compile node {node!r}"
        raise TopologyError(msg)

    def fanout(self, parent: Node, consumer: Node) -> Fanout | None:
        if len(parent.consumers) <= 1:
            return None
        return Fanout(FANOUT_OP_BASE + parent.node_id, parent.consumers.index(consumer), len(parent.consumers))

    def pass_through(self, parent: Node, consumer: Node, key: Callable[[Any], Any] | None) -> Any:
        stage = Stage(self.env, self._next_stage(), (), key=key, fanout=self.fanout(parent, consumer))
        return self.df_for(parent).mapInArrow(stage, ROW_SCHEMA)

    def input_df(self, parent: Node, consumer: Node) -> Any:
        """The rows ``consumer`` reads from ``parent`` (its own copy if ``parent`` fans out)."""
        if len(parent.consumers) > 1:
            return self.pass_through(parent, consumer, key=None)
        return self.df_for(parent)

    def chain(self, tail: OpNode) -> tuple[list[Op], Node, Node]:
        """The run of single-consumer operators ending at ``tail``: (ops, the node they read, the top op)."""
        ops: list[Op] = []
        node: Node = tail
        while True:
            assert isinstance(node, OpNode) and node.op is not None
            ops.insert(0, node.op)
            parent = node.parents[0]
            if isinstance(parent, OpNode) and len(parent.consumers) == 1:
                node = parent
                continue
            return ops, parent, node

    def stage_df(self, tail: OpNode, key: Callable[[Any], Any] | None) -> Any:
        """Fuse the run of single-consumer operators ending at ``tail`` into one stage."""
        ops, parent, node = self.chain(tail)
        stage = Stage(self.env, self._next_stage(), tuple(ops), key=key, fanout=self.fanout(parent, node))
        return self.df_for(parent).mapInArrow(stage, ROW_SCHEMA)

    def start(self, checkpoint: str | None, trigger: Trigger, max_records: int | None, query_name: str) -> FTQuery:
        topo = self.topology
        self._max_records = max_records
        sinks = [n for n in topo._nodes if isinstance(n, SinkNode)]
        if len(sinks) != 1:
            msg = f"topology {topo.name!r} needs exactly one sink, has {len(sinks)} (union streams first)"
            raise TopologyError(msg)
        if not topo._sources:
            msg = f"topology {topo.name!r} has no source"
            raise TopologyError(msg)
        dests: list[FTLayer | BatchDestination]
        if self.config.ft_on:
            layers = [FTLayer(self.config, topo.name, s.name, source_id=s.index, num_channels=self.n).open()
                      for s in topo._sources]
            dests = list(layers)
        else:  # FT off: an in-memory feed per source, served to the feed source over TCP
            host = feed_host(self.spark)
            self._feeds = [FeedServer(Feed(self.n), name=s.name, host=host).start() for s in topo._sources]
            dests = [FeedDestination(f.feed, self.config, f"{topo.name}/{f.name}") for f in self._feeds]
        progress: Progress = FeedProgress(self._feeds, self.env.dropped)  # FT on: replaced once the service runs
        ingestors: list[Ingestor] = []
        try:
            writer = self._writer(sinks[0])
            checkpoint = checkpoint or tempfile.mkdtemp(prefix=f"ftlayer-{topo.name}-ckpt-")
            if self.config.ft_on:
                progress = FTProgress(layers, FTService(layers).start())
                progress.observers = TopologyObservers.start(
                    self.spark, layers, self.config, query_name=query_name
                )
            ingestors = [Ingestor(d, s.source, key=s.key).start() for d, s in zip(dests, topo._sources, strict=True)]
            if trigger.finite:
                _await_ingest(topo.name, ingestors, trigger)
            query = (
                writer.queryName(query_name)
                .option("checkpointLocation", checkpoint)
                .trigger(**trigger.writer_kwargs())
                .start()
            )
        except BaseException:
            for ing in ingestors:
                ing.stop()
            progress.stop()
            raise
        return FTQuery(query, ingestors, progress, checkpoint, config=self.config, trigger=trigger)

    def _writer(self, sink_node: SinkNode) -> Any:
        sink = sink_node.sink
        if isinstance(sink, RedisHashSink) and sink.url is None:
            sink.url = resolved(self.config).redis_url  # the user's output server (FT off too)
        parent = sink_node.parents[0]
        if isinstance(sink, ForeachBatchSink):
            df = self.input_df(parent, sink_node)
            return df.writeStream.foreachBatch(DriverSinkBatch(self.env, sink))
        ops: tuple[Op, ...] = ()
        if isinstance(parent, OpNode) and len(parent.consumers) == 1:
            chain, base, top = self.chain(parent)
            if self.fanout(base, top) is None:  # fuse the last operators into the sink stage
                ops, parent = tuple(chain), base
        df = self.df_for(parent) if ops else self.input_df(parent, sink_node)
        out = df.mapInArrow(SinkStage(self.env, self._next_stage(), sink, ops), "written long")
        return out.writeStream.format("noop")

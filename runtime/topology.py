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
from runtime.sinks import CallableSink, ExecutorSink, ForeachBatchSink, RedisHashSink, SinkStage
from runtime.topology_checks import check_shape, fn_name

__all__ = ["Compiler", "FTQuery", "Stream", "Topology"]

FANOUT_OP_BASE = 1 << 20


@dataclass(eq=False)
class Node:
    """A vertex of the logical graph."""

    node_id: int
    parents: list[Node]
    consumers: list[Node] = field(default_factory=list)

    def label(self) -> str:
        """This node's call in a stream's description (runtime.topology_checks.describe)."""
        return type(self).__name__


@dataclass(eq=False)
class SourceNode(Node):
    name: str = ""
    source: Any = None
    key: Callable[[Any], Any] | None = None
    index: int = 0

    def label(self) -> str:
        return self.name


@dataclass(eq=False)
class OpNode(Node):
    op: Op | None = None

    def label(self) -> str:
        assert self.op is not None
        return f"{self.op.kind}({fn_name(self.op.fn)})"


@dataclass(eq=False)
class KeyByNode(Node):
    key: Callable[[Any], Any] | None = None

    def label(self) -> str:
        return f"key_by({fn_name(self.key)})"


@dataclass(eq=False)
class StateNode(Node):
    fn: Callable[[dict[str, Any], Any], Any] | None = None
    name: str = ""

    def label(self) -> str:
        return f"map_with_state({fn_name(self.fn)}, name={self.name!r})"


@dataclass(eq=False)
class UnionNode(Node):
    pass


@dataclass(eq=False)
class SinkNode(Node):
    sink: Any = None

    def label(self) -> str:
        return f"sink({type(self.sink).__name__})"


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
    """A named dataflow of FT-wrapped sources, operators and one or more sinks."""

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

    def sinks(self) -> list[SinkNode]:
        """The sink nodes, once the graph is checked: TopologyError if it has no source or no
        sink, or a shape that could never complete (see runtime.topology_checks)."""
        sinks = [n for n in self._nodes if isinstance(n, SinkNode)]
        if not sinks:
            msg = f"topology {self.name!r} has no sink"
            raise TopologyError(msg)
        if not self._sources:
            msg = f"topology {self.name!r} has no source"
            raise TopologyError(msg)
        check_shape(self.name, self._nodes, sinks)
        return sinks

    def start(
        self,
        spark: Any,
        *,
        checkpoint_location: str | None = None,
        trigger_interval_s: float = 0.5,
        max_records_per_batch: int | None = None,
    ) -> FTQuery:
        """Start ingest, the FT service and the streaming query.

        Refuses first (TopologyError naming the stream, before anything runs) a
        graph with no source, no sink, a stream that is never sunk, or a
        ForeachBatchSink next to another sink (runtime.topology_checks).
        """
        self.sinks()
        return Compiler(self, spark).start(checkpoint_location, trigger_interval_s, max_records_per_batch)


class Compiler:
    """Turns the logical graph into DataFrames (see the module docstring)."""

    def __init__(self, topology: Topology, spark: Any) -> None:
        self.topology = topology
        self.spark = spark
        # FT off: no Redis URL is resolved, so no embedded server is started either
        cfg = resolved(topology.config) if topology.config.ft_on else topology.config
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
            # s.union(s): each occurrence of a parent is an edge of its own, reading its own copy
            dfs = [self.input_df(p, node, edge=node.parents[:i].count(p)) for i, p in enumerate(node.parents)]
            return functools.reduce(lambda a, b: a.unionByName(b), dfs)
        msg = f"cannot compile node {node!r}"
        raise TopologyError(msg)

    def fanout(self, parent: Node, consumer: Node, edge: int = 0) -> Fanout | None:
        """The copy that ``consumer`` reads over its ``edge``-th edge from ``parent`` (a union may
        read one parent several times), or None if ``parent`` has one consumer edge."""
        if len(parent.consumers) <= 1:
            return None
        index = [i for i, c in enumerate(parent.consumers) if c is consumer][edge]
        return Fanout(FANOUT_OP_BASE + parent.node_id, index, len(parent.consumers))

    def pass_through(self, parent: Node, consumer: Node, key: Callable[[Any], Any] | None, edge: int = 0) -> Any:
        stage = Stage(self.env, self._next_stage(), (), key=key, fanout=self.fanout(parent, consumer, edge))
        return self.df_for(parent).mapInArrow(stage, ROW_SCHEMA)

    def input_df(self, parent: Node, consumer: Node, edge: int = 0) -> Any:
        """The rows ``consumer`` reads from ``parent`` (its own copy if ``parent`` fans out)."""
        if len(parent.consumers) > 1:
            return self.pass_through(parent, consumer, key=None, edge=edge)
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

    def start(self, checkpoint: str | None, trigger_s: float, max_records: int | None) -> FTQuery:
        topo = self.topology
        self._max_records = max_records
        sinks = topo.sinks()
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
            writer = self._writer(sinks)
            checkpoint = checkpoint or tempfile.mkdtemp(prefix=f"ftlayer-{topo.name}-ckpt-")
            if self.config.ft_on:
                progress = FTProgress(layers, FTService(layers).start())
                progress.observers = TopologyObservers.start(
                    self.spark, layers, self.config, query_name=f"ftlayer-{topo.name}"
                )
            ingestors = [Ingestor(d, s.source, key=s.key).start() for d, s in zip(dests, topo._sources, strict=True)]
            query = (
                writer.queryName(f"ftlayer-{topo.name}")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds")
                .start()
            )
        except BaseException:
            for ing in ingestors:
                ing.stop()
            progress.stop()
            raise
        return FTQuery(query, ingestors, progress, checkpoint)

    def _writer(self, sink_nodes: list[SinkNode]) -> Any:
        """The query's writer. Several executor sinks run as sink stages of one query: their
        one-row outputs are unioned into the ``noop`` writer (a ForeachBatchSink is alone)."""
        first = sink_nodes[0].sink
        if isinstance(first, ForeachBatchSink):
            df = self.input_df(sink_nodes[0].parents[0], sink_nodes[0])
            return df.writeStream.foreachBatch(DriverSinkBatch(self.env, first))
        outs = [self._sink_df(s) for s in sink_nodes]
        return functools.reduce(lambda a, b: a.unionByName(b), outs).writeStream.format("noop")

    def _sink_df(self, sink_node: SinkNode) -> Any:
        """One executor sink's stage: write, then ack (with the last operators fused in front)."""
        sink = sink_node.sink
        if isinstance(sink, RedisHashSink) and sink.url is None:
            sink.url = resolved(self.config).redis_url  # the user's output server (FT off too)
        parent = sink_node.parents[0]
        ops: tuple[Op, ...] = ()
        if isinstance(parent, OpNode) and len(parent.consumers) == 1:
            chain, base, top = self.chain(parent)
            if self.fanout(base, top) is None:  # fuse the last operators into the sink stage
                ops, parent = tuple(chain), base
        df = self.df_for(parent) if ops else self.input_df(parent, sink_node)
        return df.mapInArrow(SinkStage(self.env, self._next_stage(), sink, ops), "written long")

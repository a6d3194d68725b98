"""Compile a topology's graph to one Spark streaming query, and start what runs beside it.

Each source becomes an ingest thread on the driver (persist before visible)
and an FT source DataFrame (partition i reads channel i). Runs of
``map``/``flat_map``/``filter`` fuse into one ``mapInArrow`` stage. ``key_by``
ends a stage: the stage computes the key hash and channel, and the exchange
puts channel c in Spark partition c exactly. A stream consumed by several
operators fans out: each consumer reads its own copy with its own child id.
The sink is the last stage. A driver-side FT service rotates timeout buckets
and replays failures; it stops with the query. With FT off the sources feed
in-driver feeds instead (:mod:`runtime.driver.feed`) and no FT service runs.

State (:mod:`ftlayer.servers.state_dir`): with no ``redis_url`` the embedded server runs on the
topology's state directory (``<state_dir>/<topology>/redis``), and with no
checkpoint location the query checkpoints to ``<state_dir>/<topology>/checkpoint``,
so a re-run of the same program resumes. A non-local Spark master with no
``redis_url`` is refused before anything starts.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.errors import TopologyError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.servers.process_server import resolved
from ftlayer.servers.state_dir import TopologyState
from partitioners.factory import replay_partitioner_for
from runtime.driver.destinations import BatchDestination
from runtime.driver.feed import Feed, FeedDestination, FeedProgress, FeedServer
from runtime.driver.ingest import Ingestor
from runtime.driver.observe import TopologyObservers
from runtime.driver.token_janitor import TokenJanitor
from runtime.graph import Graph, KeyByNode, Node, Op, OpNode, SinkNode, SourceNode, StateNode, UnionNode
from runtime.query import FTProgress, FTQuery, Progress
from runtime.sinks import ForeachBatchSink, RedisUrlSink
from runtime.spark.conf import check_reachable_redis, effective_config
from runtime.spark.feed_source import feed_host
from runtime.spark.fused_read import FusedStage
from runtime.spark.row_batch import Fanout
from runtime.spark.row_contract import STAGE_INPUT, STAGE_ROW, stage_row_additions
from runtime.spark.sink_stage import DriverSinkBatch, SinkStage
from runtime.spark.stages import ROW_SCHEMA, Stage, StatefulStage, TaskEnv
from runtime.trigger import Trigger

__all__ = ["FANOUT_OP_BASE", "Compiler", "source_layer"]

FANOUT_OP_BASE = 1 << 20


def source_layer(
    config: FTConfig, topology: str, node: SourceNode, num_channels: int, *, client: redis.Redis | None = None
) -> FTLayer:
    """The FTLayer of one source, replaying as the source's ingest routes (not yet opened).

    The replay router is the replay form of the source's ``partitioning``: a
    keyless (rebalance) source's replays spread round robin over the channels
    like its live records; a keyed (fields) source's go to the channel of their key.
    """
    router = replay_partitioner_for(node.partitioning, num_channels)
    return FTLayer(
        config, topology, node.name, source_id=node.index, num_channels=num_channels, replay_router=router,
        client=client,
    )


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

    def __init__(self, topology: Graph, spark: Any) -> None:
        self.topology = topology
        self.spark = spark
        # spark.ftlayer.* of the session beat file and env, not options set in code (runtime.spark.conf)
        cfg = effective_config(topology.config, spark)
        # FT off: no Redis URL is resolved, so no embedded server is started either
        self._state: TopologyState | None = None
        self._base = cfg  # the config the state directory and the embedded server follow
        if cfg.ft_on and not cfg.redis_url:
            cfg = cfg.replace(redis_url=self._embedded_url())
        self.config = cfg
        self.n = cfg.num_channels
        names = tuple(s.name for s in topology.sources)
        # FT off: FailRecord drops happen in executors; accumulators bring the counts back
        dropped = () if cfg.ft_on else tuple(spark.sparkContext.accumulator(0) for _ in names)
        self.env = TaskEnv(cfg, topology.name, names, self.n, dropped)
        self._stage_ids = 0
        self._max_records: int | None = None
        self._feeds: list[FeedServer] = []

    def state(self) -> TopologyState:
        """The topology's state directory in this process (opened, and locked, on first use)."""
        if self._state is None:
            self._state = TopologyState.open(self._base, self.topology.name)
        return self._state

    def _embedded_url(self) -> str:
        """URL of the topology's embedded server (on its state directory); refused on a cluster."""
        check_reachable_redis(str(self.spark.conf.get("spark.master", "local") or "local"), self._base)
        return self.state().embedded_server(self._base).url

    def _next_stage(self) -> int:
        self._stage_ids += 1
        return self._stage_ids

    @functools.cache  # noqa: B019 - one compiler per start(); memoises shared sub-plans
    def df_for(self, node: Node) -> Any:
        from pyspark.sql import functions as F

        from partitioners.spark_exact import exact_repartition
        from runtime.spark.feed_source import read_feed_stream
        from runtime.spark.ft_data_sources import read_stream

        if isinstance(node, SourceNode):
            if self.config.ft_on:
                df = read_stream(self.spark, self.config, self.topology.name, node.name, self.n,
                                 max_records_per_batch=self._max_records)
            else:
                df = read_feed_stream(self.spark, self._feeds[node.index], max_records_per_batch=self._max_records)
            added = stage_row_additions(node.index)  # SOURCE_ROW to STAGE_ROW
            return df.select(*[F.lit(added[name]).cast(STAGE_ROW.kind(name).sql).alias(name) if name in added
                               else name for name in STAGE_ROW.names])
        if isinstance(node, OpNode):
            return self.stage_df(node, key=None)
        if isinstance(node, KeyByNode):
            parent = node.parents[0]
            if isinstance(parent, OpNode) and len(parent.consumers) == 1:
                keyed = self.stage_df(parent, key=node.key)
            else:
                keyed = self.pass_through(parent, node, key=node.key)
            # key_hash and channel are spent once the rows are placed: the shuffle carries the rest
            return exact_repartition(keyed, "channel", self.n, carry=STAGE_INPUT.names)
        if isinstance(node, StateNode):
            keyed = node.parents[0]
            assert isinstance(keyed, KeyByNode) and keyed.key is not None and node.fn is not None
            stage = StatefulStage(self.env, self._next_stage(), keyed.key, node.fn, node.name)
            return self.input_df(keyed, node).mapInArrow(stage, ROW_SCHEMA)
        if isinstance(node, UnionNode):
            # s.union(s): each occurrence of a parent is an edge of its own, reading its own copy
            # STAGE_INPUT: a keyed parent's rows have no key_hash and channel left; the union's readers need neither
            dfs = [self.input_df(p, node, edge=node.parents[:i].count(p)).select(*STAGE_INPUT.names)
                   for i, p in enumerate(node.parents)]
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
        """Fuse the run of single-consumer operators ending at ``tail`` into one stage; a stage
        that is its source's only reader runs inside the source's read task (fused_read)."""
        ops, parent, node = self.chain(tail)
        stage = Stage(self.env, self._next_stage(), tuple(ops), key=key, fanout=self.fanout(parent, node))
        if isinstance(parent, SourceNode) and stage.fanout is None and self.config.fuse_source_stage:
            return self.source_df(parent, FusedStage(parent.index, stage))
        return self.df_for(parent).mapInArrow(stage, ROW_SCHEMA)

    def source_df(self, node: SourceNode, fused: FusedStage) -> Any:
        """The source's DataFrame with its reader wrapped with ``fused``'s stage, run in the read
        tasks (runtime.spark.fused_read): the rows are the stage's (STAGE_ROW)."""
        from runtime.spark import feed_source, ft_source
        from runtime.spark.fused_read import read_fused

        if self.config.ft_on:
            options = ft_source.source_options(resolved(self.config), self.topology.name, node.name, self.n,
                                               max_records_per_batch=self._max_records)
            return read_fused(self.spark, ft_source.FORMAT, options, fused)
        options = feed_source.feed_options(self._feeds[node.index], max_records_per_batch=self._max_records)
        return read_fused(self.spark, feed_source.FORMAT, options, fused)

    def start(self, checkpoint: str | None, trigger: Trigger, max_records: int | None, query_name: str) -> FTQuery:
        topo = self.topology
        self._max_records = max_records
        sinks = topo.sinks()
        dests: list[FTLayer | BatchDestination]
        if self.config.ft_on:
            layers = [source_layer(self.config, topo.name, s, self.n).open() for s in topo.sources]
            dests = list(layers)
        else:  # FT off: an in-memory feed per source, served to the feed source over TCP
            host = feed_host(self.spark)
            self._feeds = [FeedServer(Feed(self.n), name=s.name, host=host).start() for s in topo.sources]
            dests = [FeedDestination(f.feed, self.config, f"{topo.name}/{f.name}") for f in self._feeds]
        progress: Progress = FeedProgress(self._feeds, self.env.dropped)  # FT on: replaced once the service runs
        ingestors: list[Ingestor] = []
        try:
            writer = self._writer(sinks)
            checkpoint = checkpoint or self.state().checkpoint()
            janitor = None
            if self.config.ft_on:
                progress = FTProgress(layers, FTService(layers).start())
                progress.observers = TopologyObservers.start(
                    self.spark, layers, self.config, query_name=query_name
                )
                progress.janitor = janitor = TokenJanitor.attach(
                    self.spark, layers, query_name=query_name, checkpoint=checkpoint
                )
            ingestors = [Ingestor(d, s.source, key=s.key, partitioning=s.partitioning, check=s.check).start()
                         for d, s in zip(dests, topo.sources, strict=True)]
            if trigger.finite:
                _await_ingest(topo.name, ingestors, trigger)
            query = (
                writer.queryName(query_name)
                .option("checkpointLocation", checkpoint)
                .trigger(**trigger.writer_kwargs())
                .start()
            )
            if janitor is not None:
                janitor.query_id = str(query.id)  # same id on a restart from this checkpoint
        except BaseException:
            for ing in ingestors:
                ing.stop()
            progress.stop()
            raise
        return FTQuery(query, ingestors, progress, checkpoint, config=self.config, trigger=trigger)

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
        if isinstance(sink, RedisUrlSink) and sink.url is None:
            # the user's output server (FT off too)
            sink.url = self.config.redis_url or self._embedded_url()
        parent = sink_node.parents[0]
        ops: tuple[Op, ...] = ()
        if isinstance(parent, OpNode) and len(parent.consumers) == 1:
            chain, base, top = self.chain(parent)
            if self.fanout(base, top) is None:  # fuse the last operators into the sink stage
                ops, parent = tuple(chain), base
        df = self.df_for(parent) if ops else self.input_df(parent, sink_node)
        return df.mapInArrow(SinkStage(self.env, self._next_stage(), sink, ops), "written long")

"""The topology API: wrap sources, operators and sinks; compile to one streaming query.

::

    topo = Topology("clicks", FTConfig.load())
    src = topo.source("events", click_generator(), key=lambda e: e["user"])
    out = src.map(parse).filter(valid).key_by(lambda e: e["user"]).map(enrich)
    out.sink(JsonLinesSink("/data/out"))          # acks after the write
    query = topo.start(spark)                      # FTQuery around a StreamingQuery
    query.await_drained(60)                        # every record acked or dead-lettered

Compilation (:mod:`runtime.spark.compile`). Each source becomes an ingest thread on the driver (persist before
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
ingest appends to an in-memory feed on the driver (:mod:`runtime.driver.feed`), read
by the ``ftlayer_feed`` source (same columns and partitions), with
``NonFTHandler`` s and no FT service. It promises nothing beyond Spark's own
behaviour; records in the feed are lost if the driver dies.

Operator ids and stage ids are assigned in construction order, so the same
program gives the same child ids after a driver restart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, TopologyError
from ftlayer.keyspace.keys import check_name
from partitioners.factory import STRATEGIES as SOURCE_STRATEGIES
from partitioners.factory import source_strategy
from runtime.graph import Graph, KeyByNode, Node, OpNode, SinkNode, SourceNode, StateNode, UnionNode
from runtime.query import FTQuery
from runtime.sinks import CallableSink, ExecutorSink, ForeachBatchSink
from runtime.sources import is_source
from runtime.spark.compile import Compiler
from runtime.spark.connect import refuse_connect
from runtime.trigger import trigger_from

__all__ = ["FTQuery", "Stream", "Topology"]


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
        the operator's position); see runtime.spark.keyed_state for its at-least-once contract."""
        if not isinstance(self._node, KeyByNode):
            msg = f"topology {self._topology.name!r}: map_with_state must directly follow key_by"
            raise TopologyError(msg)
        state = check_name("state", name or f"op{len(self._topology._graph.nodes)}")
        return Stream(self._topology, self._topology._add(StateNode, [self._node], fn=fn, name=state))

    def union(self, *others: Stream) -> Stream:
        """Records of this stream and the others."""
        return Stream(self._topology, self._topology._add(UnionNode, [self._node, *(o._node for o in others)]))

    def sink(self, sink: ExecutorSink | ForeachBatchSink | Callable[[list[Any]], Any]) -> None:
        """End the stream in a sink; a plain callable becomes a :class:`CallableSink`."""
        if not isinstance(sink, (ExecutorSink, ForeachBatchSink)):
            sink = CallableSink(sink)
        self._topology._add(SinkNode, [self._node], sink=sink)


# what the Topology API uses the JVM for (its message on a Spark Connect session)
_CONNECT_NEEDS = ("its driver-side ForeachBatchSink reads Spark's query id from sparkContext, FT-off counts come back "
                  "through Spark accumulators, and it is tested on classic sessions only")


class Topology:
    """A named dataflow of FT-wrapped sources, operators and one or more sinks."""

    def __init__(self, name: str, config: FTConfig | None = None) -> None:
        self.name = check_name("topology", name)
        self.config = config or FTConfig.load()
        self._graph = Graph(self.name, self.config)

    def _add(self, cls: type[Node], parents: list[Node], **kw: Any) -> Node:
        return self._graph.add(cls, parents, **kw)

    def source(
        self,
        name: str,
        source: Any,
        *,
        key: Callable[[Any], Any] | None = None,
        partitioning: str | None = None,
        schema: Any = None,
    ) -> Stream:
        """Wrap a user source (iterable, callable, or open/poll/close object).

        ``schema`` (Spark DDL such as ``"i long, user string"``, or a ``StructType``): each record is
        checked against it at ingest, and one that does not fit (a dict whose field does not convert
        to its column's type, a null in a ``NOT NULL`` column, a non-dict for several columns) is
        dead-lettered at once with the reason naming the column, never handed to the operators
        (:mod:`runtime.spark.schema_check`; the records the operators get are unchanged).

        ``partitioning`` picks the channel of each record, live and on replay:
        ``"fields"`` (``pmod(xxhash64(key(value)), n)``; the default when ``key`` is given),
        ``"rebalance"`` (round robin; the default without a key), ``"shuffle"`` (uniform random)
        or ``"global"`` (everything in channel 0). A replay goes where the strategy's replay
        form sends it: the same channel for ``fields`` and ``global``. Raises
        :class:`~ftlayer.errors.TopologyError` naming the source for an unknown strategy, for
        ``"fields"`` without a key, and for a key with another strategy (it would be ignored).
        """
        check_name("source", name)
        if any(s.name == name for s in self._graph.sources):
            msg = f"topology {self.name!r} already has a source named {name!r}"
            raise TopologyError(msg)
        if not is_source(source):
            msg = (
                f"topology {self.name!r}, source {name!r}: {type(source).__name__!r} is no source: give an "
                "iterable, a callable, or an object with poll() (see runtime.sources)"
            )
            raise TopologyError(msg)
        strategy = partitioning or source_strategy(key is not None)
        if strategy not in SOURCE_STRATEGIES:
            known = ", ".join(repr(s) for s in SOURCE_STRATEGIES)
            msg = f"topology {self.name!r}, source {name!r}: unknown partitioning {strategy!r}; known: {known}"
            raise TopologyError(msg)
        if (strategy == "fields") != (key is not None):
            msg = (
                f"topology {self.name!r}, source {name!r}: partitioning='fields' needs key=..."
                if key is None
                else f"topology {self.name!r}, source {name!r}: key=... is only used by partitioning='fields', "
                f"not {strategy!r}"
            )
            raise TopologyError(msg)
        check = None
        if schema is not None:
            from runtime.spark.ddl import parse_schema
            from runtime.spark.schema_check import SchemaCheck

            try:
                # no columns kept: the stages unpack each payload into a Python value anyway
                check = SchemaCheck(parse_schema(schema), keep_columns=False)
            except ConfigError as exc:
                msg = f"topology {self.name!r}, source {name!r}: schema: {exc}"
                raise TopologyError(msg) from exc
        node = self._add(SourceNode, [], name=name, source=source, key=key, index=len(self._graph.sources),
                         partitioning=strategy, check=check)
        return Stream(self, node)

    def sinks(self) -> list[SinkNode]:
        """The sink nodes, once the graph is checked: TopologyError if it has no source or no
        sink, or a shape that could never complete (see runtime.topology_checks)."""
        return self._graph.sinks()

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

        Refuses first (TopologyError naming the stream, before anything runs) a
        graph with no source, no sink, a stream that is never sunk, or a
        ForeachBatchSink next to another sink (runtime.topology_checks); and a Spark Connect
        session (SparkConnectUnsupportedError: the DataFrame path runs there, this API does not).
        """
        refuse_connect(spark, f"Topology({self.name!r}).start", _CONNECT_NEEDS)
        trigger = trigger_from(processing_time=processingTime, available_now=availableNow, once=once,
                               trigger_interval_s=trigger_interval_s)
        name = query_name if query_name is not None else f"ftlayer-{self.name}"
        if not name.strip():
            msg = f"topology {self.name!r}: query_name must not be empty"
            raise TopologyError(msg)
        self._graph.sinks()
        self._graph.config = self.config  # a user may replace .config before start()
        return Compiler(self._graph, spark).start(checkpoint_location, trigger, max_records_per_batch, name)

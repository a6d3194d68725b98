"""Build-time checks of a topology's shape: refuse what could never complete, naming the stream.

A source record completes only when every branch of its tree is acked at a
sink. So ``Topology.start()`` refuses, before anything runs, a graph in which
some stream is never sunk (a *dangling branch*, or a source nobody reads):
its records would be persisted, processed and then time out, be replayed and
end as dead letters. It also refuses a driver-side ``ForeachBatchSink`` next
to another sink (a query has one ``foreachBatch``). Every other shape the API
builds completes: several sinks, a stream read by several operators (a
diamond), ``s.union(s)``.

Errors name the stream as the chain of calls that built it, e.g.
``clicks.map(parse).filter(<lambda>)``, with the node number.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from ftlayer.errors import TopologyError
from runtime.sinks import ForeachBatchSink

MAX_DESCRIPTION_CHARS = 300


class GraphNode(Protocol):
    """What the checks read of a node of ``runtime.topology``."""

    @property
    def node_id(self) -> int: ...
    @property
    def parents(self) -> Sequence[Any]: ...
    @property
    def consumers(self) -> Sequence[Any]: ...

    def label(self) -> str: ...


def fn_name(fn: Any) -> str:
    """A user function as errors show it: its ``__name__`` (``<lambda>`` for a lambda)."""
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def describe(node: GraphNode) -> str:
    """The calls that built ``node``'s stream: ``source.op(fn)...``, unions spelled out."""
    text = _describe(node)
    if len(text) > MAX_DESCRIPTION_CHARS:
        text = "..." + text[-MAX_DESCRIPTION_CHARS:]
    return text


def _describe(node: GraphNode) -> str:
    if not node.parents:
        return node.label()
    head = _describe(node.parents[0])
    if len(node.parents) > 1:
        return f"{head}.union({', '.join(_describe(p) for p in node.parents[1:])})"
    return f"{head}.{node.label()}"


def where(node: GraphNode) -> str:
    """``<stream> (source)`` or ``<stream> (node N)``."""
    return f"{describe(node)} ({'source' if not node.parents else f'node {node.node_id}'})"


def check_shape(topology: str, nodes: Sequence[GraphNode], sinks: Sequence[Any]) -> None:
    """Refuse a graph that could never complete its records (see the module notes).

    ``sinks`` are the sink nodes (each has a ``sink`` attribute). Raises
    :class:`TopologyError` naming the first offending stream.
    """
    sink_ids = {id(s) for s in sinks}
    for node in nodes:
        if id(node) not in sink_ids and not node.consumers:
            msg = (
                f"topology {topology!r}: stream {where(node)} is never sunk, so its records could never "
                "complete (they would time out and end as dead letters); end it with .sink(...) "
                "(a sink may discard: .sink(lambda values: None)) or remove it"
            )
            raise TopologyError(msg)
    if len(sinks) > 1:
        for s in sinks:
            if isinstance(s.sink, ForeachBatchSink):
                msg = (
                    f"topology {topology!r}: stream {where(s.parents[0])} ends in a ForeachBatchSink, "
                    f"which must be the only sink (the topology has {len(sinks)}); it runs on the driver "
                    "once per micro-batch: union the streams into it, or use executor sinks"
                )
                raise TopologyError(msg)

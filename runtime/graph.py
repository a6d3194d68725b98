"""The logical graph of a topology: nodes and operators, with no Spark and no Redis in sight.

:class:`runtime.topology.Topology` builds a :class:`Graph` through its fluent
API; :class:`runtime.spark.compile.Compiler` reads it. Node ids are assigned in
construction order, so the same program builds the same graph (and the same
child ids) after a driver restart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import TopologyError
from runtime.topology_checks import check_shape, fn_name

__all__ = ["Graph", "KeyByNode", "Node", "Op", "OpNode", "SinkNode", "SourceNode", "StateNode", "UnionNode"]


@dataclass(frozen=True)
class Op:
    """One user operator: ``kind`` is 'map', 'flat_map' or 'filter'."""

    kind: str
    fn: Callable[[Any], Any]
    op_id: int


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
    partitioning: str = "rebalance"  # a partitioners.STRATEGIES name: live routing and replay routing
    check: Callable[[Any], dict[int, str]] | None = None  # a schema checked at ingest (Ingestor's check)

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


@dataclass(eq=False)
class Graph:
    """A topology's name, config and nodes (in construction order); sources in declaration order."""

    name: str
    config: FTConfig
    nodes: list[Node] = field(default_factory=list)
    sources: list[SourceNode] = field(default_factory=list)

    def add(self, cls: type[Node], parents: list[Node], **kw: Any) -> Node:
        """Append a node under ``parents``; nothing may follow a sink."""
        node_id = len(self.nodes)
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
        self.nodes.append(node)
        if isinstance(node, SourceNode):
            self.sources.append(node)
        return node

    def sinks(self) -> list[SinkNode]:
        """The sink nodes, once the graph is checked: TopologyError if it has no source or no
        sink, or a shape that could never complete (see runtime.topology_checks)."""
        sinks = [n for n in self.nodes if isinstance(n, SinkNode)]
        if not sinks:
            msg = f"topology {self.name!r} has no sink"
            raise TopologyError(msg)
        if not self.sources:
            msg = f"topology {self.name!r} has no source"
            raise TopologyError(msg)
        check_shape(self.name, self.nodes, sinks)
        return sinks

"""What one node of a Valkey Cluster says of the cluster: ``CLUSTER INFO``, ``CLUSTER NODES``, replication.

Contract: these read one node's view and never change it, but :func:`try_replicate`, which asks
a node to follow a primary and answers False while gossip has not told it of that primary yet.
``CLUSTER NODES`` is parsed here because redis-py's own parser drops the replica links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

__all__ = ["ClusterNode", "cluster_info", "link_up", "node_command", "parse_nodes", "try_replicate"]


@dataclass(frozen=True)
class ClusterNode:
    node_id: str
    port: int
    is_primary: bool
    failed: bool
    primary_id: str | None
    slots: tuple[tuple[int, int], ...]


def _raw_text(client: redis.Redis, *command: str) -> str:
    """The reply of a command whose text redis-py would otherwise reshape."""
    raw = node_command(client, *command, NEVER_DECODE=True)
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def cluster_info(client: redis.Redis) -> dict[str, str]:
    """``CLUSTER INFO`` of one node as a dict of strings."""
    pairs = (line.partition(":") for line in _raw_text(client, "CLUSTER", "INFO").splitlines())
    return {k: v.strip() for k, _, v in pairs if v}


def parse_nodes(client: redis.Redis) -> dict[str, ClusterNode]:
    """``CLUSTER NODES`` of one node, parsed (redis-py's own parser drops the replica links)."""
    text = _raw_text(client, "CLUSTER", "NODES")
    nodes: dict[str, ClusterNode] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        flags = parts[2].split(",")
        port = int(parts[1].split("@")[0].rsplit(":", 1)[1] or 0)
        slots = []
        for spec in parts[8:]:
            if spec.startswith("["):  # a slot being migrated or imported
                continue
            first, _, last = spec.partition("-")
            slots.append((int(first), int(last or first)))
        nodes[parts[0]] = ClusterNode(
            node_id=parts[0], port=port, is_primary="master" in flags,
            failed="fail" in flags or "fail?" in flags,
            primary_id=None if parts[3] == "-" else parts[3], slots=tuple(sorted(slots)),
        )
    return nodes


def node_command(client: redis.Redis, *args: Any, **options: Any) -> Any:
    """``execute_command``, which redis-py leaves untyped, in one typed place."""
    return client.execute_command(*args, **options)  # type: ignore[no-untyped-call]


def link_up(client: redis.Redis) -> bool:
    return client.info("replication").get("master_link_status") == "up"


def try_replicate(client: redis.Redis, primary_id: str) -> bool:
    try:
        node_command(client, "CLUSTER", "REPLICATE", primary_id)
    except redis.ResponseError as exc:  # "Unknown node": gossip has not reached this node yet
        if "Unknown node" in str(exc):
            return False
        raise
    return True

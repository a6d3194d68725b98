"""``ftlayer redis``: an embedded Valkey server, or a cluster of them, in the foreground until Ctrl-C or SIGTERM.

The servers themselves are the core's (:mod:`ftlayer.servers.embedded`,
:mod:`ftlayer.servers.cluster`); this module is the command's side: signals, the lines it
prints, and stopping what it started.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from ftlayer.servers.cluster import EmbeddedCluster
from ftlayer.servers.embedded import EmbeddedServer

__all__ = ["run_cluster_foreground", "run_foreground"]


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def run_foreground(data_dir: str | None = None, port: int | None = None) -> int:
    """``ftlayer redis``: run an embedded server until Ctrl-C or SIGTERM; prints its URL.

    Both signals stop the server gracefully and remove its data directory if it is a temporary
    one (a given ``data_dir`` is kept, AOF included).
    """
    if threading.current_thread() is threading.main_thread():  # SIGTERM stops like Ctrl-C
        signal.signal(signal.SIGTERM, _raise_interrupt)
    server = EmbeddedServer(data_dir=data_dir, port=port, die_with_parent=True).start()
    try:  # a signal may come as soon as the first line is out: every line is inside the try
        print(f"ftlayer: embedded valkey-server running at {server.url}", flush=True)
        print(f"ftlayer: data dir {server.data_dir} (AOF on); Ctrl-C stops it", flush=True)
        print(f"ftlayer: use it with  export FTLAYER_REDIS_URL={server.url}", flush=True)
        while server.pid is not None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def run_cluster_foreground(
    data_dir: str | None = None, primaries: int = 3, replicas: int = 1, cluster_node_timeout_ms: int = 1500,
) -> int:
    """``ftlayer redis --cluster``: run an embedded cluster until Ctrl-C or SIGTERM; prints its URLs."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    cluster = EmbeddedCluster(primaries, replicas, data_dir=data_dir,
                              cluster_node_timeout_ms=cluster_node_timeout_ms)
    try:
        cluster.start()
        print(f"ftlayer: embedded valkey cluster running at {','.join(cluster.urls)}", flush=True)
        print(f"ftlayer: {primaries} primaries with {replicas} replica(s) each, formed in "
              f"{cluster.formed_in_s or 0:.1f} s; data dir {cluster.data_dir}; Ctrl-C stops it", flush=True)
        for port in cluster.primary_ports():
            replica_urls = ", ".join(f"redis://127.0.0.1:{p}" for p in cluster.replica_ports(port))
            print(f"ftlayer:   primary redis://127.0.0.1:{port}  replicas {replica_urls or '-'}", flush=True)
        print("ftlayer: point redis_url (FTLAYER_REDIS_URL, --redis-url) at any of these nodes; "
              "num_shards = 16 spreads each source over the primaries", flush=True)
        while not stop.wait(0.5):
            if not cluster.live_ports():
                break
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)
    return 0

"""kill -9 of the primary that owns a source, mid-run, with durability = "replicated": a
replica takes over and no record whose persist returned is lost (real Valkey Cluster).

The writer keeps persisting and acking through the failover with the same FTLayer: the
cluster client finds the new primary itself, and the caller only retries calls that
raised (every script is idempotent, so a retried persist files nothing twice).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.cluster import EmbeddedCluster
from serialization.serializers import make_record

BATCHES, PER_BATCH = 40, 200


def _retrying(what: str, call: object, deadline_s: float = 90.0) -> object:
    """Call until it succeeds; an error during the failover is retried (idempotent calls)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return call()  # type: ignore[operator]
        except FTLayerError as exc:
            if time.monotonic() > end:
                raise AssertionError(f"{what} still failing after {deadline_s} s: {exc}") from exc
            time.sleep(0.2)


@pytest.mark.slow
def test_kill_9_of_the_owning_primary_loses_no_confirmed_record(tmp_path: Path) -> None:
    # two replicas per primary: after the failover the new primary still has one, so WAIT can succeed
    with EmbeddedCluster(primaries=3, replicas=2, data_dir=tmp_path / "cl") as cluster:
        cfg = FTConfig(redis_url=cluster.urls[0], namespace="fo", durability="replicated",
                       waitaof_timeout_ms=1000, timeout_s=600.0)
        layer = FTLayer(cfg, "topo", "src", num_channels=2).open()
        owner = int(layer.store.node_client().connection_pool.connection_kwargs["port"])
        confirmed: list[int] = []
        acked: set[int] = set()
        errors: list[BaseException] = []
        half = threading.Event()

        def writer() -> None:
            try:
                for b in range(BATCHES):
                    recs = [make_record(layer, (b, i)) for i in range(PER_BATCH)]
                    _retrying("persist", lambda recs=recs: layer.persist(recs))
                    confirmed.extend(r.record_id.source_record_id for r in recs)
                    if b % 2 == 0:  # ack every other batch
                        deltas = {r.record_id.source_record_id: r.record_id.current_record_id for r in recs}
                        _retrying("ack", lambda d=deltas: layer.ack(d))
                        acked.update(deltas)
                    if b == BATCHES // 4:
                        half.set()
            except BaseException as exc:
                errors.append(exc)
                half.set()

        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        assert half.wait(120)
        cluster.kill_primary(owner)
        failover = cluster.wait_failover(owner)
        thread.join(300)
        assert not thread.is_alive() and not errors, errors
        print(f"\nprimary {owner} killed; replica {failover.new_primary_port} took over in {failover.seconds:.1f} s")

        expected = [sid for sid in confirmed if sid not in acked]
        missing = sum(not p for p in layer.pending_of(expected))
        assert len(confirmed) == BATCHES * PER_BATCH
        assert missing == 0, f"{missing} of {len(expected)} confirmed, unacked records lost in the failover"
        assert layer.pending_count() == len(expected)  # no acked record came back

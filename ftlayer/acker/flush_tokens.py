"""Flush tokens: what makes a flush idempotent, scoped to one micro-batch of one query.

A :class:`FlushToken` names one flush of one task: ``batch`` is
``<query id>/<micro-batch id>`` and ``task`` the stage, partition and source
(``st3/p1/s0``). The ``FLUSH`` script keeps the applied ``task`` s of a batch in
one hash per source, ``tok:<batch>`` (``HSETNX``), so:

- **Within a run** a retried task or client call sends the same token and is
  skipped (counted in ``duplicate_flushes``).
- **Across a restart on the same checkpoint** the query id is the same (Spark
  stores it in the checkpoint's metadata, and sets it on every task as the
  local property ``sql.streaming.queryId``), so a re-run batch gets the same
  tokens as the attempt that crashed: a flush that landed then is not applied
  twice.
- **Across runs with a new checkpoint** the query id differs, so the new run
  never collides with tokens the old run left behind (batch ids restart at 0).
- **Clean-up.** Once a batch has committed, no task of it runs again, so its
  token hash can go: :func:`delete_batch_tokens` deletes a run's batches up to
  one id (one ``DEL`` per batch and source). Every hash also expires after the
  acker's token TTL, as a safety net for a driver that dies before it cleans up.
  Deleting a token early never loses a record: a delta applied twice cancels
  out, and the record times out and is replayed.

A plain string token (the public ``FTLayer.xor(token=...)``) is its own batch
with one task, as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ftlayer.store.source_store import SourceStore


@dataclass(frozen=True)
class FlushToken:
    """One task's flush: ``batch`` = ``<query id>/<batch id>`` (the key), ``task`` (the field)."""

    batch: str
    task: str

    def child(self, suffix: str) -> FlushToken:
        """The token of a part of this flush (one source, one chunk)."""
        return FlushToken(self.batch, f"{self.task}/{suffix}")


def as_token(token: str | FlushToken) -> FlushToken:
    """A plain string token is a batch of its own with one task."""
    return token if isinstance(token, FlushToken) else FlushToken(token, "-")


def batch_key(query_id: str, batch_id: int | str) -> str:
    """The ``batch`` part of a token: ``<query id>/<micro-batch id>``."""
    return f"{query_id}/{batch_id}"


def delete_batch_tokens(stores: Iterable[SourceStore], query_id: str, batch_ids: Iterable[int]) -> int:
    """Delete the token hashes of ``batch_ids`` of one query, for every source; returns keys deleted.

    Call it only for committed batches (see the module contract). Pipelined, 500 keys per call.
    """
    ids = list(batch_ids)
    deleted = 0
    for store in stores:
        keys = [store.keys.token(batch_key(query_id, b)) for b in ids]
        for i in range(0, len(keys), 500):
            # one source's keys share its hash tag: one slot, one node on a cluster
            deleted += _delete(store, keys[i : i + 500])
    return deleted


def _delete(store: SourceStore, keys: list[str]) -> int:
    """DEL ``keys`` (idempotent), riding out a cluster failover."""
    return int(store.ride_out(lambda: store.client.delete(*keys)))


def stale_batches(store: SourceStore, query_id: str, upto: int) -> list[int]:
    """Batch ids ``<= upto`` of ``query_id`` that still have a token hash (one SCAN; for a restart,
    whose first clean-up does not know what an earlier driver left)."""
    prefix = store.keys.token(batch_key(query_id, ""))
    out: list[int] = []
    found = store.ride_out(lambda: list(store.client.scan_iter(match=prefix + "*", count=1000)))
    for raw in found:
        tail = raw.decode()[len(prefix):]
        if tail.isdigit() and int(tail) <= upto:
            out.append(int(tail))
    return sorted(out)

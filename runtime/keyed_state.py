"""Per-key state for a keyed operator (``key_by(...).map_with_state(fn)``), kept in Redis.

The operator runs in the Spark partition that owns the key, so one task at a
time touches a key's state. For each task the stage loads the state of the
keys it sees (one HMGET per Arrow batch), lets ``fn(state, value)`` read and
change the key's state dict and return its outputs, and writes the changed
states back (one HSET) **before** it flushes its acks. So a record is acked
only after its effect on the state is stored.

Guarantee: at-least-once effects. A record that is replayed (its task died
after the state write but before the ack, or it timed out) is applied to the
state again. Make ``fn`` idempotent per origin id if that matters, e.g. keep
the last origin ids seen in the state. With FT status off the state is kept
in Redis all the same (this hook is the one part of a topology that talks to
Redis from executors in that mode).

State values must be msgpack-serializable (see ``serialization.payload``).
Key: ``<namespace>:{<topology>/state-<name>}:state`` (hash field = the msgpack
bytes of the key); ``name`` is given to ``map_with_state`` (default: the
operator's position in the topology, ``op<N>``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.connection import client_for
from serialization.payload import pack_payload, unpack_payload


def state_key(namespace: str, topology: str, name: str) -> str:
    """The Redis hash holding one keyed operator's state."""
    return f"{namespace}:{{{topology}/state-{name}}}:state"


class KeyedStateStore:
    """Loads and saves per-key state dicts for one operator in one task. Not thread-safe."""

    def __init__(self, config: FTConfig, topology: str, name: str) -> None:
        self.config = config
        self.key = state_key(config.namespace, topology, name)
        self.states: dict[bytes, dict[str, Any]] = {}
        self.dirty: set[bytes] = set()

    def _client(self) -> Any:
        return client_for(self.config.redis_url, self.config.connect_timeout_s,
                          outage_budget_s=self.config.outage_budget_s)

    def load(self, keys: Iterable[Any]) -> None:
        """Fetch the state of keys not loaded yet in this task (one round trip)."""
        missing = list(dict.fromkeys(f for f in (pack_payload(k) for k in keys) if f not in self.states))
        if not missing:
            return
        for field, raw in zip(missing, self._client().hmget(self.key, missing), strict=True):
            self.states[field] = unpack_payload(raw) if raw is not None else {}

    def state_for(self, key: Any) -> dict[str, Any]:
        """The (mutable) state dict of ``key``; marked dirty, since ``fn`` may change it."""
        field = pack_payload(key)
        self.dirty.add(field)
        return self.states.setdefault(field, {})

    def save(self) -> None:
        """Write back every state handed out since the last save (one round trip)."""
        if self.dirty:
            self._client().hset(self.key, mapping={f: pack_payload(self.states[f]) for f in self.dirty})
            self.dirty.clear()

    def read_all(self) -> dict[Any, dict[str, Any]]:
        """Every key's state (for tests and inspection)."""
        raw = self._client().hgetall(self.key)
        return {unpack_payload(f): unpack_payload(v) for f, v in raw.items()}

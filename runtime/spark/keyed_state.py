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

Poison states fail only their record. :meth:`KeyedStateStore.apply` runs one
record against its key's state all or nothing: if ``fn`` raises, or leaves a
state that msgpack cannot carry, the state goes back to what it was before the
record and the record fails (``KeyedStateError`` names the state and the key),
so it is replayed and finally dead-lettered while the other records of the
key go on. A stored state that cannot be unpacked fails every record of its
key the same way, until it is repaired or deleted.

State values must be msgpack-serializable (see ``serialization.payload``).
Key: ``<namespace>:{<topology>/state-<name>}:state`` (hash field = the msgpack
bytes of the key); ``name`` is given to ``map_with_state`` (default: the
operator's position in the topology, ``op<N>``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ftlayer.config import FTConfig
from ftlayer.errors import KeyedStateError, SerializationError
from ftlayer.store.connection import client_for, ride_out
from serialization.payload import pack_payload, unpack_payload

T = TypeVar("T")


def state_key(namespace: str, topology: str, name: str) -> str:
    """The Redis hash holding one keyed operator's state."""
    return f"{namespace}:{{{topology}/state-{name}}}:state"


class KeyedStateStore:
    """Loads and saves per-key state dicts for one operator in one task. Not thread-safe."""

    def __init__(self, config: FTConfig, topology: str, name: str) -> None:
        self.config = config
        self.name = name
        self.key = state_key(config.namespace, topology, name)
        self.states: dict[bytes, dict[str, Any]] = {}
        self.packed: dict[bytes, bytes] = {}  # last good packed state per key (loaded or after a record)
        self.broken: dict[bytes, SerializationError] = {}  # keys whose stored state cannot be unpacked
        self.dirty: set[bytes] = set()

    def _client(self) -> Any:
        return client_for(self.config.redis_url, self.config.connect_timeout_s,
                          outage_budget_s=self.config.outage_budget_s)

    def _field(self, key: Any) -> bytes:
        try:
            return pack_payload(key)
        except SerializationError as exc:
            msg = f"state {self.name!r}: key {key!r} cannot be packed: {exc}"
            raise KeyedStateError(msg) from exc

    def load(self, keys: Iterable[Any]) -> None:
        """Fetch the state of keys not loaded yet in this task (one round trip).

        A key that cannot be packed is skipped here (:meth:`apply` fails its
        record); a stored state that cannot be unpacked marks its key broken.
        """
        fields: list[bytes] = []
        for k in keys:
            try:
                fields.append(pack_payload(k))
            except SerializationError:
                continue
        self._load_fields(fields)

    def _load_fields(self, fields: Iterable[bytes]) -> None:
        missing = list(dict.fromkeys(f for f in fields if f not in self.states and f not in self.broken))
        if not missing:
            return
        client = self._client()
        got = ride_out(client, lambda: client.hmget(self.key, missing), self.config.outage_budget_s)
        for field, raw in zip(missing, got, strict=True):
            if raw is None:
                self.states[field] = {}
                continue
            try:
                self.states[field] = unpack_payload(raw)
                self.packed[field] = raw
            except SerializationError as exc:
                self.broken[field] = exc

    def apply(self, key: Any, run: Callable[[dict[str, Any]], T]) -> T:
        """``run(state)`` on ``key``'s state, all or nothing (see the module notes).

        Raises what ``run`` raised, or :class:`KeyedStateError` when the key or
        the state cannot be packed or the stored state cannot be unpacked; in
        every case the key's state is back to what it was before.
        """
        field = self._field(key)
        self._load_fields([field])
        if field in self.broken:
            msg = f"state {self.name!r} of key {key!r} cannot be loaded: {self.broken[field]}"
            raise KeyedStateError(msg) from self.broken[field]
        state = self.states[field]
        try:
            out = run(state)
        except BaseException:
            self._restore(field)
            raise
        try:
            packed = pack_payload(state)
        except SerializationError as exc:
            self._restore(field)
            msg = f"state {self.name!r} of key {key!r} cannot be saved: {exc}"
            raise KeyedStateError(msg) from exc
        self.packed[field] = packed
        self.dirty.add(field)
        return out

    def _restore(self, field: bytes) -> None:
        raw = self.packed.get(field)
        self.states[field] = unpack_payload(raw) if raw is not None else {}

    def save(self) -> None:
        """Write back every state :meth:`apply` changed since the last save, in the packed form
        it checked (one round trip)."""
        if self.dirty:
            client, mapping = self._client(), {f: self.packed[f] for f in self.dirty}
            # idempotent (the same packed states again), so a cluster failover is ridden out
            ride_out(client, lambda: client.hset(self.key, mapping=mapping), self.config.outage_budget_s)
            self.dirty.clear()

    def read_all(self) -> dict[Any, dict[str, Any]]:
        """Every key's state (for tests and inspection)."""
        raw = self._client().hgetall(self.key)
        return {unpack_payload(f): unpack_payload(v) for f, v in raw.items()}

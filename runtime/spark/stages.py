"""Operator stages: fused chains of map / flat_map / filter, run in executors over Arrow.

A *stage* is the run of operators between two Spark exchanges (a keyed edge,
a fan-out or the sink). It compiles to one ``mapInArrow`` function. Per Arrow
batch it decodes each payload once (msgpack), runs the fused chain through the
task's handler (which anchors, derives child ids, XORs and catches failures),
and re-encodes the outputs once. Records created and consumed inside the
chain never leave the task, so their XORs cancel and are not sent at all:
a stage XORs its inputs out and its final outputs in.

Deltas travel in-band, not through Redis: each output row carries, in its
``delta`` column, the XOR its input contributes (input id out, children in,
plus whatever the input itself carried); an input with no output emits a
*carrier row* (null payload) holding it. Only the sink flushes, once per
task, so a record costs one acker update per sink task instead of one per
stage, and a recomputed stage carries the same deltas again (they depend
on each row alone). A stage flushes only the explicit fails it saw, with
the token ``<query id>/<micro-batch>`` + ``st<stage>/p<partition>``
(``ftlayer.acker.flush_tokens``), so a retried task never applies them twice.

Rows between stages: :data:`runtime.spark.row_contract.STAGE_ROW`, ``src int, sid long,
cid long, origin long, key_hash long, channel int, payload binary, delta long`` (the origin
id rides along so sinks can deduplicate replays; carrier rows have a null payload). A stage
before a keyed edge fills ``key_hash`` and ``channel = pmod(key_hash, n)`` from the key
selector; the exchange then puts
channel c in Spark partition c exactly (``partitioners.spark_exact``).

Everything here is shipped to executors and must be picklable: user functions
too (plain functions and lambdas are, through cloudpickle).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ftlayer.acker.flush_tokens import FlushToken
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import NO_KEY_HASH
from runtime.graph import Op
from runtime.spark.handlers import FTHandler, handler_for
from runtime.spark.output_encoding import OutputEncoder
from runtime.spark.row_batch import CARRIER, Fanout, decode_batch, encoded_to_arrow
from runtime.spark.row_contract import STAGE_ROW
from runtime.spark.task_tokens import task_token
from runtime.spark.worker_heap import freeze_worker_heap
from serialization.payload import pack_payload

ROW_SCHEMA = STAGE_ROW.ddl  # a stage's mapInArrow output schema


def make_chain(ops: Sequence[Op]) -> Callable[[Any], list[Any]]:
    """Fuse operators into one function from an input value to its list of outputs."""
    steps = [(op.kind, op.fn) for op in ops]
    if len(steps) == 1 and steps[0][0] == "map":  # the common stage: one map, no list per step
        only = steps[0][1]
        return lambda value: [only(value)]

    def run(value: Any) -> list[Any]:
        values = [value]
        for kind, fn in steps:
            if kind == "map":
                values = [fn(v) for v in values]
            elif kind == "filter":
                values = [v for v in values if fn(v)]
            else:
                values = [o for v in values for o in fn(v)]
        return values

    return run


@dataclass(frozen=True)
class TaskEnv:
    """What a task needs to reach the FT layer: picklable config and source names."""

    config: FTConfig
    topology: str
    sources: tuple[str, ...]
    num_channels: int
    dropped: tuple[Any, ...] = ()  # FT off: one Spark accumulator per source, records FailRecord dropped

    def report(self, handler: FTHandler) -> None:
        """FT off: add the task's FailRecord drops to the driver's per-source counters."""
        for src, n in handler.dropped.items():
            if src < len(self.dropped):
                self.dropped[src].add(n)

    def layers(self) -> dict[int, FTLayer]:
        return {
            # tasks wait out a Redis outage (outage_budget_s) rather than spend their attempts
            i: FTLayer(self.config, self.topology, name, source_id=i, num_channels=self.num_channels,
                       outage_budget_s=self.config.outage_budget_s)
            for i, name in enumerate(self.sources)
        }

    def token(self, stage: str) -> FlushToken:
        """This task's flush token: the query id Spark keeps in the checkpoint, the batch, the
        stage and partition (same after a restart on the checkpoint, new for a new checkpoint)."""
        return task_token(stage)


@dataclass(frozen=True)
class Stage:
    """A compiled stage; ``__call__`` is the mapInArrow function."""

    env: TaskEnv
    stage_id: int
    ops: tuple[Op, ...]
    key: Callable[[Any], Any] | None = None  # set when a keyed edge follows
    fanout: Fanout | None = None

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        env = self.env
        freeze_worker_heap(env.config.freeze_worker_heap)
        handler = handler_for(env.config.ft_on, self.stage_id)
        handler.layers = functools.cache(env.layers)  # ftlayer.reset_timeout() in the operators
        chain, encoder = make_chain(self.ops), OutputEncoder(self.key)
        n = env.num_channels
        for rb in batches:
            yield encoded_to_arrow(handler.process_batch(decode_batch(rb, handler, self.fanout), chain, encoder), n)
        env.report(handler)
        if not handler.xors.empty():  # explicit fails only: deltas went downstream
            handler.flush(env.layers(), env.token(f"st{self.stage_id}"))


@dataclass(frozen=True)
class StatefulStage:
    """``key_by(key).map_with_state(fn)``: ``fn(state, value)`` returns outputs; see runtime.spark.keyed_state.

    Runs right after the keyed exchange, so every record of a key is in this
    partition. States are saved before the acks are flushed. A record whose
    ``fn``, state or outputs fail leaves its key's state as it was and fails
    alone (``KeyedStateStore.apply``).
    """

    env: TaskEnv
    stage_id: int
    key: Callable[[Any], Any]
    fn: Callable[[dict[str, Any], Any], Iterable[Any]]
    state_name: str

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        from runtime.spark.keyed_state import KeyedStateStore

        env = self.env
        freeze_worker_heap(env.config.freeze_worker_heap)
        handler = handler_for(env.config.ft_on, self.stage_id)
        handler.layers = functools.cache(env.layers)  # ftlayer.reset_timeout() in fn
        store = KeyedStateStore(env.config, env.topology, self.state_name)
        key, fn = self.key, self.fn

        def chain(value: Any) -> list[Any]:
            # outputs are packed inside apply(): an output that cannot be packed undoes the state change
            return store.apply(key(value), lambda state: [(pack_payload(o), NO_KEY_HASH) for o in fn(state, value)])

        def keys(values: list[Any]) -> Iterator[Any]:
            for value in values:
                if value is not CARRIER:
                    try:
                        yield key(value)
                    except Exception:  # raises again in chain(), which fails the record
                        continue

        for rb in batches:
            batch = decode_batch(rb, handler, None)
            store.load(keys(batch.values))
            yield encoded_to_arrow(handler.process_batch(batch, chain), env.num_channels)
        store.save()  # state first: the sink acks a record only after this stage's task ended
        env.report(handler)
        if not handler.xors.empty():
            handler.flush(env.layers(), env.token(f"st{self.stage_id}"))

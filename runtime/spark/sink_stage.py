"""The last stage of a query: write, then ack (executor sinks) or collect, call, ack (foreachBatch).

:class:`SinkStage` is the ``mapInArrow`` function of an executor sink: for each
Arrow batch it decodes the values once, calls the sink's ``write``, and on
success acks every record of the batch (current id XOR the carried delta); a
write that raises fails the batch's records, which are replayed. The task
flushes at its end, with an idempotent token. :class:`DriverSinkBatch` does the
same on the driver for a :class:`~runtime.sinks.ForeachBatchSink`.

Progressive acks (``sink_ack_every_records``): once that many written records
are unacked, the task sends their deltas right away, applied only where they
complete a record (``FTLayer.complete``, safe without a token); the rest waits
for the end-of-task flush. A retried task (attempt > 0, e.g. after its Python
worker was killed) first drops the rows whose record is no longer pending: an
earlier attempt completed it (written and acked) or it failed (it will be
replayed). So a retry writes again only what the dead attempt had not acked.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ftlayer.acker.flush_tokens import FlushToken, batch_key
from ftlayer.records.lineage import lineage_ids
from runtime.graph import Op
from runtime.sinks import ExecutorSink, ForeachBatchSink, SinkContext
from runtime.spark.handlers import CARRIER, FTHandler, handler_for
from runtime.spark.row_batch import RowBatch, decode_batch
from runtime.spark.row_contract import STAGE_INPUT
from runtime.spark.stages import TaskEnv, make_chain
from runtime.spark.task_tokens import NO_QUERY, QUERY_ID_PROPERTY
from runtime.spark.worker_heap import freeze_worker_heap
from serialization.payload import unpack_payload

__all__ = ["DriverSinkBatch", "SinkStage"]


@dataclass(frozen=True)
class SinkStage:
    """The mapInArrow function of an executor sink: decode, write, ack (or fail) as it goes, flush at the end."""

    env: TaskEnv
    stage_id: int
    sink: ExecutorSink
    ops: tuple[Op, ...] = ()  # operators fused in front of the write (one Python hop less)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        freeze_worker_heap(self.env.config.freeze_worker_heap)
        tc = TaskContext.get()
        batch_id = (tc.getLocalProperty("streaming.sql.batchId") if tc else None) or "0"
        partition = tc.partitionId() if tc else 0
        attempt = tc.attemptNumber() if tc else 0
        handler = handler_for(self.env.config.ft_on, self.stage_id)
        layers = self.env.layers() if handler.ft_on else {}
        handler.layers = lambda: layers  # ftlayer.reset_timeout() in the fused operators
        every = self.env.config.sink_ack_every_records if handler.ft_on else 0
        chain = make_chain(self.ops) if self.ops else None
        written = unacked_rows = 0
        unacked: list[RowBatch] = []  # rows written and acked in the task, not yet sent
        ctx = SinkContext(str(batch_id), partition, attempt)
        for rb in batches:
            batch = decode_batch(rb, handler, None)
            if chain is not None:  # fused operators: their deltas ride on their outputs
                batch = handler.process_batch(batch, chain)
            batch = handler.receive_batch(batch)
            if every and attempt > 0 and len(batch):  # a retry: what an earlier attempt completed stays written
                batch = handler.still_pending(layers, batch)
            sids = batch.sid.tolist()
            ctx = SinkContext(str(batch_id), partition, attempt, batch.origin.tolist(), sids,
                              lineage_ids(batch.origin, batch.cid))
            try:
                self.sink.write(batch.values, ctx)
            except Exception as exc:  # a failed write fails its records; they are replayed
                handler.fail_all(_ids([batch]), exc)
            else:
                handler.ack_batch(batch)
                written += len(batch)
                if every:
                    unacked.append(batch)
                    unacked_rows += len(batch)
            if every and unacked_rows >= every:
                handler.flush_completing(layers, unacked)
                unacked, unacked_rows = [], 0
        self.env.report(handler)
        if handler.ft_on:
            handler.flush(layers, self.env.token(f"st{self.stage_id}"))
        self.sink.after_flush(ctx)
        yield pa.RecordBatch.from_arrays([pa.array([written], pa.int64())], names=["written"])


def _ids(batches: list[RowBatch]) -> Iterator[tuple[int, int, int]]:
    """``(src, sid, 0)`` of every row of ``batches`` (what ``fail_all`` takes)."""
    for batch in batches:
        for src, sid in zip(batch.src.tolist(), batch.sid.tolist(), strict=True):
            yield src, sid, 0


@dataclass
class DriverSinkBatch:
    """foreachBatch function of a :class:`ForeachBatchSink`: collect, call, ack on the driver."""

    env: TaskEnv
    sink: ForeachBatchSink

    def __call__(self, df: Any, batch_id: int) -> None:
        if not self.env.config.ft_on:  # FT off: no acks; a failing sink fails the batch (Spark's rules)
            self.sink.fn([unpack_payload(r["payload"]) for r in df.select("payload").collect()], batch_id)
            return
        handler: FTHandler = handler_for(True, 0)
        rows = handler.receive(
            (r["src"], r["sid"], r["cid"], r["origin"], CARRIER if r["payload"] is None else r["payload"], r["delta"])
            for r in df.select(*STAGE_INPUT.names).collect()
        )
        ids = [(src, sid, cid ^ delta) for src, sid, cid, _, _, delta in rows]
        try:
            self.sink.fn([unpack_payload(row[4]) for row in rows], batch_id)
        except Exception as exc:  # the batch's records fail and are replayed
            handler.fail_all(ids, exc)
        else:
            handler.ack(ids)
        # foreachBatch runs on the query's own thread, which carries Spark's query id
        query_id = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY) or NO_QUERY
        handler.flush(self.env.layers(), FlushToken(batch_key(query_id, batch_id), "sink/driver"))

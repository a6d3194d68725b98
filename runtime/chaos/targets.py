"""Where a chaos scenario writes: ``ftlayer chaos --sink lines | postgres | delta | redis``.

- ``lines`` (default): JSON-lines part files (``CollectingSink``): at-least-once, so a replay of a
  delivered record shows as a duplicate.
- ``postgres``, ``delta``, ``redis``: the effectively-once sinks of ``runtime.idempotent``, used as a
  user would (``postgres_sink`` under ``ftlayer.acking`` on the DataFrame pipeline, ``PostgresSink``
  on the Topology pipeline, and so on). Each row is ``i``, ``user``, ``origin`` and ``replay``
  (of the write that landed first) under its lineage id. The check reads the target back, so a
  duplicate it counts is one the target really holds.

A :class:`Target` is plain data (picklable, and passed to a scenario's driver processes as
:meth:`Target.spec`). Postgres needs a server: ``--sink-url``, else :func:`open_target` starts an
embedded one in the work directory (stopped by :meth:`OpenTarget.close`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runtime.chaos.errors import ChaosError
from runtime.sinks import ExecutorSink, SinkContext

__all__ = ["SINKS", "OpenTarget", "Target", "open_target"]

SINKS = ("lines", "postgres", "delta", "redis")
_COLUMNS = {"i": "bigint", "user": "text", "origin": "bigint", "replay": "boolean"}


@dataclass(frozen=True)
class Target:
    """One scenario's output: ``kind``, ``out_dir`` (lines), ``url`` (Postgres conninfo, Redis URL
    or Delta path) and ``name`` (table or hash key)."""

    kind: str
    out_dir: str
    url: str = ""
    name: str = ""

    @property
    def effectively_once(self) -> bool:
        return self.kind != "lines"

    def spec(self) -> str:
        """This target as one argument for a driver process (:meth:`from_spec` reads it back)."""
        return json.dumps(asdict(self))

    @staticmethod
    def from_spec(spec: str) -> Target:
        return Target(**json.loads(spec))

    def df_writer(self) -> Callable[[Any, int], None]:
        """The effectively-once ``foreachBatch`` function (the chaos pipeline wraps it in acking)."""
        if self.kind == "postgres":
            from runtime.idempotent.postgres import postgres_sink

            return postgres_sink(self.url, self.name)
        if self.kind == "delta":
            from runtime.idempotent.delta import delta_sink

            return delta_sink(self.url)
        if self.kind == "redis":
            from runtime.idempotent.redis_hash import redis_sink

            return redis_sink(self.url, self.name)
        msg = f"chaos sink {self.kind!r} writes lines, not through a foreachBatch sink"
        raise ChaosError(msg)

    def topology_sink(self) -> ExecutorSink:
        """The Topology pipeline's sink: ``CollectingSink`` for lines, else the target's
        ``ExecutorSink`` with each value's origin and replay flag added."""
        if self.kind == "lines":
            from runtime.testing import CollectingSink

            return CollectingSink(self.out_dir)
        return _WithMeta(self)

    def lines(self) -> list[dict[str, Any]]:
        """What the target holds, in ``CollectingSink``'s line format (for the checker)."""
        if self.kind == "lines":
            from runtime.testing import CollectingSink

            return CollectingSink(self.out_dir).read() if Path(self.out_dir).is_dir() else []
        rows = self._rows()
        return [{"origin": r["origin"], "replay": bool(r["replay"]), "lineage": r["lineage_id"], "partition": -1,
                 "value": {"i": int(r["i"]), "user": r["user"]}} for r in rows]

    def _rows(self) -> list[dict[str, Any]]:
        if self.kind == "postgres":
            import psycopg
            from psycopg.rows import dict_row

            with psycopg.connect(self.url, row_factory=dict_row) as conn:
                table = psycopg.sql.Identifier(self.name)
                return list(conn.execute(psycopg.sql.SQL("SELECT * FROM {}").format(table)).fetchall())
        if self.kind == "delta":
            from deltalake import DeltaTable

            if not Path(self.url).exists():
                return []
            return list(DeltaTable(self.url).to_pyarrow_table().to_pylist())
        from ftlayer.store.connection import client_for

        raw = client_for(self.url).hgetall(self.name)
        return [{**json.loads(v), "lineage_id": k.decode()} for k, v in raw.items()]  # type: ignore[union-attr]


class _WithMeta(ExecutorSink):
    """The target's Topology sink, writing ``{i, user, origin, replay}`` per value."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._sink: ExecutorSink | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"target": self.target, "_sink": None}

    def _inner(self) -> ExecutorSink:
        if self._sink is None:
            t = self.target
            if t.kind == "postgres":
                from runtime.idempotent.postgres import PostgresSink

                self._sink = PostgresSink(t.url, t.name)
            elif t.kind == "delta":
                from runtime.idempotent.delta import DeltaSink

                self._sink = DeltaSink(t.url)
            else:
                from runtime.idempotent.redis_hash import RedisOnceSink

                self._sink = RedisOnceSink(t.name, url=t.url)
        return self._sink

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        rows = [{"i": v["i"], "user": v["user"], "origin": o, "replay": s != o}
                for v, o, s in zip(values, ctx.origins, ctx.sids, strict=True)]
        self._inner().write(rows, ctx)


@dataclass
class OpenTarget:
    """A target and what it started (an embedded Postgres), to close after the scenario."""

    target: Target
    server: Any = None

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def open_target(kind: str, workdir: Path, *, namespace: str, redis_url: str | None,
                sink_url: str | None = None) -> OpenTarget:
    """The target of ``kind`` for a scenario in ``workdir``: a fresh table, Delta path or hash."""
    out = str(workdir / "out")
    if kind == "lines":
        return OpenTarget(Target("lines", out))
    if kind == "postgres":
        from runtime.idempotent.pg_embedded import EmbeddedPostgres
        from runtime.idempotent.postgres import PostgresWriter

        server = None
        url = sink_url
        if url is None:
            server = EmbeddedPostgres().start()
            url = server.url
        table = f"chaos_{namespace}".lower().replace("-", "_")[:60]
        writer = PostgresWriter(url, table)
        writer.ensure_table(_COLUMNS)
        writer.close()
        return OpenTarget(Target("postgres", out, url, table), server)
    if kind == "delta":
        return OpenTarget(Target("delta", out, sink_url or str(workdir / "delta")))
    if kind == "redis":
        url = sink_url or redis_url
        if not url:
            msg = "chaos --sink redis needs a Redis URL: --sink-url, or the FT server's"
            raise ChaosError(msg)
        return OpenTarget(Target("redis", out, url, f"{namespace}:chaos-out"))
    msg = f"chaos sink {kind!r}: expected one of {', '.join(SINKS)}"
    raise ChaosError(msg)

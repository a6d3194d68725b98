"""Every DataFrame-path effectively-once sink in a real streaming query whose first write lands and
then fails: the batch's records are replayed under new source record ids and written again, and the
target still holds each record once (issue 27, item 2). Real PostgreSQL, a real Delta table, a real
Redis; the same query with the lineage ids of fresh replays (the replayer's kept root current id
removed) leaves duplicates in every target.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from runtime.idempotent.delta import delta_sink
from runtime.idempotent.pg_embedded import EmbeddedPostgres
from runtime.idempotent.postgres import PostgresWriter, postgres_sink
from runtime.idempotent.redis_hash import redis_sink
from runtime.testing import once
from tests.runtime.test_dataframe import Run

pytestmark = pytest.mark.spark
N = 600
Target = tuple[Callable[[Any, int], None], Callable[[], list[int]]]  # (foreachBatch fn, the i's it holds)


def _postgres(postgres: EmbeddedPostgres, table: str) -> Target:
    PostgresWriter(postgres.url, table).ensure_table({"i": "bigint", "user": "text"})

    def held() -> list[int]:
        import psycopg

        with psycopg.connect(postgres.url) as conn:
            return [r[0] for r in conn.execute(f"SELECT i FROM {table}").fetchall()]

    return postgres_sink(postgres.url, table), held


def _delta(path: Path) -> Target:
    def held() -> list[int]:
        from deltalake import DeltaTable

        return [int(i) for i in DeltaTable(str(path)).to_pyarrow_table().column("i").to_pylist()]

    return delta_sink(str(path)), held


def _redis(url: str, key: str, client: redis.Redis) -> Target:
    import json

    def held() -> list[int]:
        return [json.loads(v)["i"] for v in client.hvals(key)]  # type: ignore[union-attr]

    return redis_sink(url, key), held


@pytest.mark.parametrize("kind", ["postgres", "delta", "redis"])
def test_a_landed_batch_that_is_replayed_leaves_each_record_once(
    kind: str, spark: Any, ft_config: FTConfig, tmp_path: Path, request: pytest.FixtureRequest,
    redis_client: redis.Redis, namespace: str, table: str,
) -> None:
    if kind == "postgres":
        write, held = _postgres(request.getfixturevalue("postgres"), table)
    elif kind == "delta":
        write, held = _delta(tmp_path / "delta")
    else:
        write, held = _redis(ft_config.redis_url or "", f"{namespace}:out", redis_client)
    offered: list[int] = []
    marks = tmp_path / "marks"

    def landed_then_failed(df: Any, batch_id: int) -> None:
        write(df, batch_id)
        rows = df.count()
        offered.append(rows)
        if rows and once(marks, "fail"):
            msg = "the write landed, the reply was lost"
            raise OSError(msg)

    r = Run(spark, ft_config, tmp_path, N, sink_retry_budget_s=0.0)  # no in-place retry: the batch is replayed
    r.start(r.df.select("i", "user", "_ftlayer"), landed_then_failed)
    stats = r.finish()
    assert stats["replayed"] > 0 and sum(offered) > N  # the replays were written again
    assert sorted(held()) == list(range(N))  # each record once: nothing lost, nothing twice

"""Producing apart from consuming: a running DataFrame query reads what two ``ftlayer ingest``
processes persist into its source (issues 16 and 18).

The query starts first, on an empty source; then two CLI processes share one JSON-lines file
(``--worker 0/2`` and ``1/2``). The check counts the lines the test wrote, not what ingest
reports: every good line reaches the sink, the line without a key is dead-lettered, nothing
times out, nothing stays pending, and the query is still up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame

import ftlayer
from ftlayer.config import FTConfig
from runtime.dataframe import sources

pytestmark = pytest.mark.spark

N = 3000


def test_query_reads_what_two_ingest_processes_persist(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    cfg = ft_config.replace(timeout_s=60.0)
    name = "ing" + uuid.uuid4().hex[:8]
    data = tmp_path / "events.jsonl"
    with data.open("w") as fh:
        for i in range(N):
            fh.write(json.dumps({"i": i, "user": f"u{i % 5}", "n": i * 2}) + "\n")
        fh.write(json.dumps({"i": N, "n": 0}) + "\n")  # no "user": dead-lettered by ingest
    handle = sources.source(name, "events", config=cfg, num_channels=2)
    df = ftlayer.read_stream(spark, name, "events", schema="i long, user string, n long", config=cfg, num_channels=2)
    seen: list[int] = []

    def write(batch: DataFrame, _batch_id: int) -> None:
        seen.extend(r["i"] for r in batch.select("i").collect())

    query = (df.filter("n >= 0").writeStream.foreachBatch(ftlayer.acking(write, config=cfg))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="500 milliseconds").start())
    try:
        procs = [subprocess.Popen(
            [sys.executable, "-m", "runtime.cli.main", "ingest", name, "events", str(data), "--key", "user",
             "--worker", f"{w}/2", "--num-channels", "2", "--redis-url", cfg.redis_url,
             "--namespace", cfg.namespace, "--offsets-dir", str(tmp_path / "off")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ)) for w in (0, 1)]
        for p in procs:
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 0, out
        deadline = time.monotonic() + 240
        while True:
            st = handle.stats()
            assert query.exception() is None, str(query.exception())
            if st["acked"] == N and handle.layer.pending_count() == 0:
                break
            assert time.monotonic() < deadline, f"not drained: {st}"
            time.sleep(0.5)
        assert st["persisted"] == N and st["dead_lettered"] == 1 and st["failed_timeout"] == 0, st
        assert sorted(set(seen)) == list(range(N))
        assert query.isActive
    finally:
        query.stop()
        handle.stop()

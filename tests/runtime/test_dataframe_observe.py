"""Observability on the DataFrame path (real Spark): the progress log and the Prometheus metrics work
for a DataFrame query as they do for a topology."""

from __future__ import annotations

import logging
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

import ftlayer
from ftlayer.config import FTConfig
from ftlayer.servers.ports import free_port
from runtime.dataframe import sources

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_dataframe_query_logs_its_progress_and_serves_metrics(
    spark: Any, ft_config: FTConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ftlayer.progress")
    port = free_port()
    cfg = ft_config.replace(metrics_port=port)
    name = "obs" + uuid.uuid4().hex[:6]
    handle = sources.source(name, "events", config=cfg, num_channels=2)
    handle.ingest({"i": i} for i in range(300))
    df = ftlayer.read_stream(spark, name, "events", schema="i long", config=cfg, num_channels=2)
    query = (df.writeStream.foreachBatch(ftlayer.acking(lambda d, _b: d.count(), config=cfg))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="300 milliseconds").start())
    try:
        deadline = time.monotonic() + 120
        while handle.stats()["acked"] < 300:
            assert time.monotonic() < deadline, handle.stats()
            time.sleep(0.2)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        deadline = time.monotonic() + 30
        while not any(f"{name}/events" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no progress line for the DataFrame query"
            time.sleep(0.2)
    finally:
        query.stop()
        handle.stop()
    labels = f'namespace="{cfg.namespace}",source="events",topology="{name}"'
    assert f"ftlayer_records_acked_total{{{labels}}} 300.0" in text, text
    assert f"ftlayer_sink_breaker_open{{{labels}}} 0.0" in text
    assert f"ftlayer_running_batches{{{labels}}}" in text
    line = next(r.getMessage() for r in caplog.records if f"{name}/events" in r.getMessage())
    assert "acked=" in line and "batch=" in line

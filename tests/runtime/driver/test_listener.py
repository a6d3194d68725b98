"""The progress listener on a real local Spark streaming query, with a real FT source in Redis."""

from __future__ import annotations

import logging
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.ports import free_port
from runtime.driver.listener import LOGGER_NAME, FTProgressListener, attach, detach
from runtime.driver.metrics import MetricsError
from runtime.driver.observe import TopologyObservers
from serialization.serializers import make_record

pytestmark = pytest.mark.spark


def _busy_layer(cfg: FTConfig) -> FTLayer:
    layer = FTLayer(cfg, "topo", "src", num_channels=2).open()
    recs = [make_record(layer, {"n": i}, key=f"k{i}") for i in range(5)]
    layer.persist(recs)
    layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs[:2]})
    layer.fail([recs[2].record_id.source_record_id], "boom")
    assert layer.replay_due().replayed == 1
    return layer


def _start_rate_query(spark: Any, name: str) -> Any:
    return (
        spark.readStream.format("rate").option("rowsPerSecond", 50).load()
        .writeStream.format("noop").queryName(name)
        .trigger(processingTime="300 milliseconds")
        .start()
    )


def test_listener_logs_spark_and_ft_figures_per_batch(
    spark: Any, ft_config: FTConfig, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    layer = _busy_layer(ft_config)
    cfg = ft_config.replace(metrics_port=free_port())
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    # what Topology.start does: listener limited to its query, plus the metrics exporter
    observers = TopologyObservers.start(spark, [layer], cfg, query_name="ftlayer-listener-test")
    other = attach(spark, [layer], query_name="some-other-query")
    mine = observers.listener
    assert mine is not None
    query = _start_rate_query(spark, "ftlayer-listener-test")
    try:
        deadline = time.monotonic() + 90
        while mine.batches_logged < 3 and time.monotonic() < deadline:
            assert query.exception() is None
            time.sleep(0.2)
        assert observers.metrics_url is not None
        with urllib.request.urlopen(observers.metrics_url, timeout=10) as resp:
            metrics = resp.read().decode()
    finally:
        query.stop()
        observers.stop()
        observers.stop()
        detach(spark, other)
    assert mine.batches_logged >= 3, "no progress events reached the listener"
    assert 'ftlayer_pending_records{namespace="' + cfg.namespace + '",source="src",topology="topo"} 3.0' in metrics
    assert observers.metrics_url is None and observers.listener is None
    assert other.batches_logged == 0  # it only reports on its own query
    lines = [r for r in caplog.records if r.name == LOGGER_NAME and r.levelno == logging.INFO]
    assert len(lines) >= 3
    msg = lines[-1].getMessage()
    for spark_part in ("query=ftlayer-listener-test", "batch=", "inputRows=", "inputRowsPerSecond=",
                       "processedRowsPerSecond=", "batchDurationMs="):
        assert spark_part in msg, msg
    # pending 2 + the replay = 3; acked 2; failed 1 (explicit); replayed 1; nothing dead-lettered
    assert "| topo/src pending=3 acked=2 failed=1 replayed=1 deadLettered=0" in msg, msg
    assert any(int(r.spark_progress["numInputRows"]) > 0 for r in lines)  # type: ignore[attr-defined]
    assert lines[-1].ft_sources == {  # type: ignore[attr-defined]
        "topo/src": {"pending": 3, "acked": 2, "failed": 1, "replayed": 1, "dead_lettered": 0}
    }


def test_listener_survives_an_unreachable_redis(caplog: pytest.LogCaptureFixture) -> None:
    cfg = FTConfig(redis_url=f"redis://:pw-9z@127.0.0.1:{free_port()}/0", namespace="gone", connect_timeout_s=0.5)
    listener = FTProgressListener([FTLayer(cfg, "topo", "src", num_channels=2)])
    progress = SimpleNamespace(
        name=None, id="q-1", batchId=4, numInputRows=10, inputRowsPerSecond=float("nan"),
        processedRowsPerSecond=20.0, batchDuration=500,
    )
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        listener.onQueryProgress(SimpleNamespace(progress=progress))  # type: ignore[arg-type]
    (record,) = [r for r in caplog.records if r.name == LOGGER_NAME]
    assert record.levelno == logging.WARNING
    text = record.getMessage()
    assert "query=q-1 batch=4 inputRows=10 inputRowsPerSecond=- processedRowsPerSecond=20.0" in text
    assert "ft=unavailable" in text and "pw-9z" not in text and "***" in text


def test_observers_detach_the_listener_when_metrics_cannot_start(
    ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    calls: list[tuple[str, Any]] = []
    fake_spark = SimpleNamespace(streams=SimpleNamespace(
        addListener=lambda lst: calls.append(("add", lst)), removeListener=lambda lst: calls.append(("remove", lst)),
    ))
    layer = FTLayer(ft_config, "topo", "src", num_channels=2).open()
    bad = ft_config.replace(metrics_host="192.0.2.1", metrics_port=free_port())  # not an address of ours
    with pytest.raises(MetricsError):
        TopologyObservers.start(fake_spark, [layer], bad, query_name="q")
    assert [c[0] for c in calls] == ["add", "remove"] and calls[0][1] is calls[1][1]
    calls.clear()
    off = TopologyObservers.start(fake_spark, [layer], ft_config, query_name="q")  # metrics_port 0: listener only
    assert off.metrics_url is None and off.listener is not None
    off.stop()
    assert [c[0] for c in calls] == ["add", "remove"]

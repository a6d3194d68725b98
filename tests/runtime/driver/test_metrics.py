"""Prometheus metrics against the real server: figures at scrape time, HTTP, sharing, errors."""

from __future__ import annotations

import logging
import math
import urllib.request
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.ports import free_port
from runtime.driver.metrics import (
    LATENCY_METRIC,
    MetricsError,
    MetricsExporter,
    metric_names,
    observe_complete_latency,
)
from serialization.serializers import make_record
from tests.runtime.cli.test_status import _busy_source


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict[Any, float], name: str, ns: str, source: str = "src", **extra: str) -> float:
    labels = {"namespace": ns, "topology": "topo", "source": source, **extra}
    return samples[(name, tuple(sorted(labels.items())))]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


def test_metrics_match_the_source_counters(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = _busy_source(ft_config)
    stats = layer.stats()
    ns = ft_config.namespace
    samples = _samples(MetricsExporter([layer]).render())
    names = {
        "persisted": "ftlayer_records_persisted_total", "acked": "ftlayer_records_acked_total",
        "replayed": "ftlayer_records_replayed_total", "dead_lettered": "ftlayer_records_dead_lettered_total",
        "requeued": "ftlayer_records_requeued_total", "late_deltas": "ftlayer_late_deltas_total",
        "duplicate_flushes": "ftlayer_duplicate_flushes_total",
    }
    for counter, name in names.items():
        assert _value(samples, name, ns) == stats[counter], counter
    assert (stats["acked"], stats["replayed"], stats["dead_lettered"]) == (3, 2, 1)
    assert _value(samples, "ftlayer_records_failed_total", ns, kind="explicit") == stats["failed_explicit"] == 4
    assert _value(samples, "ftlayer_records_failed_total", ns, kind="timeout") == 0
    assert _value(samples, "ftlayer_pending_records", ns) == stats["pending"] == 3
    assert _value(samples, "ftlayer_failed_waiting_records", ns) == 1
    assert _value(samples, "ftlayer_dead_letters", ns) == 1
    assert _value(samples, "ftlayer_bucket_generation", ns) == stats["gen"]
    assert 0 <= _value(samples, "ftlayer_oldest_pending_age_seconds", ns) < 30
    assert _value(samples, "ftlayer_service_alive", ns) == 0
    assert _value(samples, "ftlayer_redis_up", ns) == 1
    assert layer.buckets.acquire_lease(30.0)
    assert _value(_samples(MetricsExporter([layer]).render()), "ftlayer_service_alive", ns) == 1


def test_every_documented_metric_is_served(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = _busy_source(ft_config)
    observe_complete_latency(0.3, layer)
    names = {s[0] for s in _samples(MetricsExporter([layer]).render())}
    for name in metric_names():
        assert name in names or f"{name}_count" in names, name


def test_complete_latency_histogram(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = FTLayer(ft_config, "topo", "src", num_channels=2).open()
    for seconds in (0.02, 0.3, 0.4, 7.0, -1.0, math.nan):
        observe_complete_latency(seconds, layer)
    samples = _samples(MetricsExporter([layer]).render())
    ns = ft_config.namespace
    assert _value(samples, f"{LATENCY_METRIC}_count", ns) == 5  # NaN ignored, -1 counted as 0
    assert _value(samples, f"{LATENCY_METRIC}_bucket", ns, le="0.5") == 4
    assert _value(samples, f"{LATENCY_METRIC}_bucket", ns, le="+Inf") == 5
    assert _value(samples, f"{LATENCY_METRIC}_sum", ns) == pytest.approx(7.72)


def test_http_endpoint_shared_by_two_exporters(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    cfg = ft_config.replace(metrics_port=free_port())
    a = FTLayer(cfg, "topo", "a", num_channels=2).open()
    b = FTLayer(cfg, "other", "b", num_channels=2).open()
    a.persist([make_record(a, "x", key="k")])
    first = MetricsExporter([a], cfg).start()
    second = MetricsExporter([b, a], cfg).start()
    try:
        assert first.url == second.url == f"http://127.0.0.1:{cfg.metrics_port}/metrics"
        samples = _samples(_get(first.url))
        assert _value(samples, "ftlayer_pending_records", cfg.namespace, "a") == 1
        assert samples[("ftlayer_pending_records", tuple(sorted(
            {"namespace": cfg.namespace, "topology": "other", "source": "b"}.items())))] == 0
        second.stop()  # the server stays up for the first exporter, which still serves source a only
        text = _get(first.url)
        assert 'source="a"' in text and 'source="b"' not in text
    finally:
        first.stop()
        second.stop()
    with pytest.raises(OSError):
        _get(f"http://127.0.0.1:{cfg.metrics_port}/metrics")


def test_off_by_default_and_port_errors(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = FTLayer(ft_config, "topo", "src", num_channels=2).open()
    exporter = MetricsExporter([layer]).start()
    assert not exporter.enabled and not exporter.running and exporter.url is None
    exporter.stop()
    with pytest.raises(ConfigError, match="metrics_port"):
        ft_config.replace(metrics_port=70000)
    with pytest.raises(ConfigError, match="metrics_host"):
        ft_config.replace(metrics_host="")
    assert FTConfig.load(env={"FTLAYER_METRICS_PORT": "9464"}).metrics_port == 9464
    cfg = ft_config.replace(metrics_host="192.0.2.1", metrics_port=free_port())  # TEST-NET: not ours to bind
    with pytest.raises(MetricsError, match=r"192\.0\.2\.1"):
        MetricsExporter([layer], cfg).start()


def test_unreachable_redis_reports_down_without_failing_the_scrape(
    ft_config: FTConfig, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    up = FTLayer(ft_config, "topo", "src", num_channels=2).open()
    dead_cfg = ft_config.replace(redis_url=f"redis://:pw-x1@127.0.0.1:{free_port()}/0", connect_timeout_s=0.5)
    down = FTLayer(dead_cfg, "topo", "gone", num_channels=2)
    with caplog.at_level(logging.WARNING, logger="ftlayer.runtime.driver.metrics"):
        samples = _samples(MetricsExporter([up, down]).render())
    ns = ft_config.namespace
    assert _value(samples, "ftlayer_redis_up", ns, "src") == 1
    assert _value(samples, "ftlayer_redis_up", ns, "gone") == 0
    assert ("ftlayer_pending_records", tuple(sorted(
        {"namespace": ns, "topology": "topo", "source": "gone"}.items()))) not in samples
    assert "cannot connect" in caplog.text and "pw-x1" not in caplog.text

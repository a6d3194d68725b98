"""``ftlayer bench webhook mqtt`` at a tiny size: the figures are there, positive and written to results.json.
(The real run is scripts/bench webhook mqtt; docs/bench/results.json keeps its figures.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.cli.main import main


@pytest.mark.slow
def test_receiver_bench_writes_both_ratios(redis_server_url: str, mosquitto_binary: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "webhook", "mqtt", "--redis-url", redis_server_url, "--out", str(tmp_path),
                 "--webhook-records", "2000", "--webhook-batch", "50", "--webhook-connections", "3",
                 "--mqtt-records", "1000", "--receiver-repeats", "1"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    data = json.loads((tmp_path / "results.json").read_text())
    for name in ("webhook", "mqtt"):
        ratio = data[f"{name}_vs_raw_ratio"]
        assert ratio == printed[f"{name}_vs_raw_ratio"] > 0
        figures = data[name]
        assert round(figures[f"{name}_vs_raw_ratio"]["median"], 3) == ratio
        assert figures["raw_records_per_s"]["median"] > 0 and figures["ftlayer_records_per_s"]["median"] > 0
    assert data["webhook"]["batch"] == 50 and data["webhook"]["connections"] == 3
    assert data["webhook"]["ingest_only_records_per_s"]["median"] > 0  # the same records, no HTTP


@pytest.mark.slow
def test_webhook_bench_says_where_the_cpu_goes(redis_server_url: str) -> None:
    from runtime.bench.receivers import bench_webhook

    figures = bench_webhook(redis_server_url, records=1000, batch=50, connections=2, repeats=2)
    cpu = figures["cpu_us_per_request"]
    # the raw server is an HTTP thread of this process; ftlayer's receiver is its front process (HTTP) and this
    # process's link and ingest threads, and Redis works; the load client of each is measured too
    assert set(cpu) == {"raw_http_thread", "raw_load_client", "ftlayer_front_process", "ftlayer_link_thread",
                        "ftlayer_ingest_thread", "redis_server", "ftlayer_load_client"}
    for part in cpu.values():
        assert 0 <= part["min"] <= part["median"] <= part["max"]
    # a request's work costs at least tens of microseconds, and below a second (the front process is read
    # in 10 ms clock ticks: a round this small may read 0 there)
    for part in ("raw_http_thread", "ftlayer_ingest_thread", "ftlayer_link_thread", "ftlayer_load_client"):
        assert 10 < cpu[part]["median"] < 1e6, part

"""The driver is SIGKILLed mid-run and restarted: records still pending time out, replay, arrive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.sinks import JsonLinesSink

pytestmark = pytest.mark.spark


def _driver(phase: int, url: str, ns: str, tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.driver_app", "--phase", str(phase), "--redis-url", url,
         "--namespace", ns, "--checkpoint", str(tmp / "ckpt"), "--out", str(tmp / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )


def test_killed_driver_restarts_and_nothing_persisted_is_lost(
    redis_server_url: str, namespace: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    layer = FTLayer(FTConfig(redis_url=redis_server_url, namespace=namespace), "restart", "clicks")
    first = _driver(1, redis_server_url, namespace, tmp_path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            st = layer.stats()
            if st["persisted"] == 1500 and 0 < st["acked"] < 1500:
                break
            assert first.poll() is None, "phase 1 ended before it could be killed"
            time.sleep(0.1)
        else:
            pytest.fail(f"phase 1 never reached the kill point: {layer.stats()}")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its Spark JVM, no clean shutdown
        first.wait(30)
    at_kill = layer.stats()
    assert at_kill["pending"] > 0
    second = _driver(2, redis_server_url, namespace, tmp_path)
    out, _ = second.communicate(timeout=400)
    assert second.returncode == 0, out
    final = layer.stats()
    delivered = {line["origin"] for line in JsonLinesSink(tmp_path / "out").read_all()}
    assert len(delivered) == final["persisted"] == 1500
    assert final["pending"] == 0 and final["failed_waiting"] == 0
    assert final["dead_lettered"] == 0
    assert layer.leftovers() == []

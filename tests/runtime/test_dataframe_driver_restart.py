"""The DataFrame path: the driver is SIGKILLed mid-run and restarted on the same checkpoint.

Records persisted by the first driver and not yet acked are read again by the restarted one
(the re-run of the batch Spark had planned, or a timeout and replay): every record that passes
the filter reaches the sink, the filtered ones are acked, nothing stays pending, no keys leak.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer

pytestmark = pytest.mark.spark

N = 1500


def _driver(phase: int, url: str, ns: str, tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.df_driver_app", "--phase", str(phase), "--redis-url", url,
         "--namespace", ns, "--checkpoint", str(tmp / "ckpt"), "--out", str(tmp / "out"), "--records", str(N)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )


def test_killed_dataframe_driver_restarts_and_loses_nothing(
        redis_server_url: str, namespace: str, tmp_path: Path) -> None:
    layer = FTLayer(FTConfig(redis_url=redis_server_url, namespace=namespace), "dfrestart", "events", num_channels=2)
    first = _driver(1, redis_server_url, namespace, tmp_path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            st = layer.stats()
            if st["persisted"] == N and 0 < st["acked"] < N // 2:
                break
            assert first.poll() is None, "phase 1 ended before it could be killed"
            time.sleep(0.05)
        else:
            pytest.fail(f"phase 1 never reached the kill point: {layer.stats()}")
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its Spark JVM, no clean shutdown
        first.wait(30)
    assert layer.stats()["pending"] > 0
    second = _driver(2, redis_server_url, namespace, tmp_path)
    out, _ = second.communicate(timeout=400)
    assert second.returncode == 0, out
    final = layer.stats()
    written = {json.loads(line)["i"] for p in (tmp_path / "out").iterdir()
               for line in p.read_text().splitlines() if line}
    assert written == {i for i in range(N) if i % 3}, f"missing {sorted({i for i in range(N) if i % 3} - written)[:20]}"
    assert final["persisted"] == final["acked"] == N and final["pending"] == 0, final
    assert final["dead_lettered"] == 0
    assert layer.leftovers() == []

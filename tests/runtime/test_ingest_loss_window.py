"""The loss window of a source that cannot rewind and has no ack hook, measured with a real kill -9.

A process running only ingest (a generator source, a real server) is SIGKILLed mid-stream. What
the generator produced but ingest had not persisted is lost: at most one ingest batch,
``min(flush_batch_size, ingest_batch_records)`` records; with ``ingest_batch_records = 1`` at
most the one record in hand.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.chaos.procs import pending_ids


def _killed_mid_stream(url: str, ns: str, tmp: Path, batch: int) -> tuple[int, int]:
    """(produced, lost) after a SIGKILL once more than 2000 records are persisted."""
    produced_file = tmp / f"produced-{batch}"
    layer = FTLayer(FTConfig(redis_url=url, namespace=ns), "window", "gen", num_channels=2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.runtime.ingest_app", "--redis-url", url, "--namespace", ns,
         "--produced", str(produced_file), "--batch", str(batch)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if layer.store.client.exists(layer.store.keys.stats) and layer.stats()["persisted"] > 2000:
                break
            assert proc.poll() is None, "ingest ended before it could be killed"
            time.sleep(0.01)
        else:
            pytest.fail("ingest never persisted 2000 records")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    produced = {int(x) for x in produced_file.read_text().split()}
    persisted = set(pending_ids(layer))
    assert persisted <= produced
    return len(produced), len(produced - persisted)


@pytest.mark.slow
def test_a_killed_driver_loses_at_most_one_ingest_batch(
    redis_server_url: str, namespace: str, redis_client: object, tmp_path: Path
) -> None:
    results = {}
    for batch in (1, 200):
        produced, lost = _killed_mid_stream(redis_server_url, f"{namespace}b{batch}", tmp_path, batch)
        results[batch] = (produced, lost)
        print(f"ingest_batch_records={batch}: {produced} produced, {lost} lost at the kill")
        assert lost <= batch
    for batch in (1, 200):  # the fixture cleans only its own namespace
        keys = list(redis_client.scan_iter(match=f"{namespace}b{batch}:*"))  # type: ignore[attr-defined]
        if keys:
            redis_client.delete(*keys)  # type: ignore[attr-defined]

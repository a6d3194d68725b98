"""`ftlayer redis --cluster` as a user runs it: URLs printed, a usable cluster, a clean stop on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from runtime.cli.main import main


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.slow
def test_ftlayer_redis_cluster_prints_urls_and_stops_every_node_on_sigterm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli.main", "redis", "--cluster", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        urls = re.search(r"running at (\S+)", line).group(1).split(",")  # type: ignore[union-attr]
        assert len(urls) == 6
        rest = [proc.stdout.readline() for _ in range(5)]
        assert "point redis_url" in "".join(rest) and "yet" not in "".join(rest)  # ftlayer runs on it (issue 18)
        rc = redis.RedisCluster.from_url(urls[0])
        for i in range(100):
            rc.set(f"key-{i}", i)
        assert rc.get("key-42") == b"42"
        rc.close()
        for url in urls:
            with redis.Redis.from_url(url) as node:
                pids.append(int(node.info("server")["process_id"]))
        assert len(list(tmp_path.glob("node-*/nodes.conf"))) == 6
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert [p for p in pids if _alive(p)] == []
    assert tmp_path.exists()  # a given data dir is kept


def test_port_with_cluster_is_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["redis", "--cluster", "--port", "7000"]) == 2
    assert "--port cannot be used with --cluster" in capsys.readouterr().err

"""``scripts/demo dataframe``: the demo as a DataFrame pipeline, run as a user runs it: a stateful
windowed count through a killed worker, a poison record, transient row failures, a slow batch and
a batch that fails before Spark's commit; the report checks every (window, user) count."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_dataframe_demo_reports_nothing_lost_and_nothing_left(tmp_path: Path) -> None:
    env = {**os.environ, "FTLAYER_NAMESPACE": "demodftest", "FTLAYER_EMBEDDED_DATA_DIR": str(tmp_path)}
    env.pop("FTLAYER_REDIS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.cli.demo", "dataframe", "--records", "3000", "--fail-every", "25",
         "--timeout-s", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env, check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:]
    assert re.search(r"^lost\s+0 ", out, re.M) and re.search(r"^acker entries left\s+0 ", out, re.M)
    assert re.search(r"^worker killed\s+yes", out, re.M)
    assert re.search(r"^dead letters\s+1 .*poison record", out, re.M)
    counted = re.search(r"^records counted\s+(\d+) .*expected (\d+)", out, re.M)
    assert counted is not None and counted.group(1) == counted.group(2) == str(3000 - 75 - 1)
    replays = int(re.search(r"^replays\s+(\d+)", out, re.M).group(1))  # type: ignore[union-attr]
    assert 3 < replays <= 3000 // 25 + 3
    assert re.search(r"^leftover state\s+none", out, re.M)
    assert re.search(r"^counts checked\s+(\d+) of \1 right\s+\(every count equals", out, re.M), out[-3000:]
    assert re.search(r"^failed before commit\s+batch 2, re-run by Spark after a restart", out, re.M)
    held = re.search(r"^held by a slow batch\s+(\d+) timeouts postponed", out, re.M)
    assert held is not None and int(held.group(1)) > 0, out[-4000:]
    lines = out.splitlines()
    start = lines.index("== ftlayer demo report (DataFrame pipeline) ==")
    noisy = [line for line in lines[:start] if re.search(r"Traceback|^\s+at ", line)]
    first = next((i for i, line in enumerate(lines[:start]) if line in noisy), 0)
    assert noisy == [], "\n".join(lines[max(0, first - 5) : first + 40])  # the first one, in its context

"""``dist``: ftlayer built and installed from its wheel, once per test run (``tests/distribution/builds.py``).

Under pytest-xdist every worker has its own session, so the build goes to the run's shared
temporary directory under a file lock: the first worker that asks builds, the others wait and reuse
it. What it costs (seconds per step) is in ``dist.timings_s`` and in ``timings.json`` beside it.
A failed build fails the tests that asked (never skips).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from tests.distribution.builds import BuildError, Dist, build_dist


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    work = shared / "ftlayer-dist"
    work.mkdir(exist_ok=True)
    done = work / "timings.json"
    with open(work / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            built = json.loads(done.read_text())
            return Dist(**{k: Path(v) for k, v in built["paths"].items()}, timings_s=built["timings_s"])
        try:
            result = build_dist(work)
        except BuildError as exc:
            pytest.fail(f"building ftlayer's distribution failed: {exc}", pytrace=False)
        paths = {"wheel": result.wheel, "archive": result.archive, "python": result.python,
                 "bare_python": result.bare_python}
        done.write_text(json.dumps({"paths": {k: str(v) for k, v in paths.items()}, "timings_s": result.timings_s}))
        return result

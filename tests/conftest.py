"""Shared fixtures: one real Redis server and one SparkSession per test session.

- ``redis_server_url``: ``$FTLAYER_TEST_REDIS_URL`` if set (CI can point it at
  Debian's redis-server), else an embedded valkey-server started once.
- ``redis_client`` / ``namespace`` / ``ft_config``: a clean namespace per test;
  every key under it is deleted afterwards.
- ``fake_redis``: fakeredis with Lua, only for fast unit tests of single functions.
- ``spark``: one local[2,4] SparkSession (2 cores, up to 4 attempts per task).
- ``valkey_cluster``: a Valkey Cluster of 3 primaries and 3 replicas from the same
  binary, started once on first use. Tests must not kill its
  nodes; fault tests start their own ``EmbeddedCluster``.
- ``mosquitto``: starts real Mosquitto brokers (``EmbeddedMosquitto``, persistence on, a free
  port), one per call, stopped after the test. A missing ``mosquitto`` is installed with
  apt-get when the tests run as root; if that fails the test fails (never skips).

Markers (pyproject.toml): a test that starts a JVM, here or in a child process, is marked
``spark``, and every ``spark`` test is also ``slow`` (added here), so ``-m "not spark"`` (the fast
tier, ``scripts/test --fast``) starts no JVM. That is enforced: a test not marked ``spark`` fails
if it asks for the ``spark`` fixture, and runs with ``SPARK_HOME`` pointing at a ``spark-submit``
that refuses (so a child process that launches Spark fails too), and fails if a JVM started in
this process during it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.servers.embedded import EmbeddedServer
from tests.machine_lock import Alone, held_shared, machine_to_myself, name_the_run, remove_run_files
from tests.spark_jvm import configure as configure_spark_jvms

# The suite runs in 3 workers on 2 cores beside JVMs: Hypothesis's timings (a 200 ms deadline per
# example, the too-slow health check on input generation) fail tests there for the machine's load,
# not for the property. Every property and example count stays; only those two timings are off.
settings.register_profile("ftlayer", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ftlayer")

# Every JVM the suite starts (the session below, driver apps, the demo, the Connect server) gets the
# tests' Spark conf (tests/spark-conf/spark-defaults.conf says what and why) and, once built, the
# class-data archive (tests/spark_jvm.py). A SPARK_CONF_DIR set by the caller wins.
configure_spark_jvms()

pytest_plugins = ["tests.cpu_log", "tests.waiting_lane"]


@pytest.fixture(scope="session", autouse=True)
def spark_scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every JVM this test process starts from now on (its session, and the driver apps its tests
    start and kill) keeps its Spark scratch files under this test run's temporary directory, not in
    /tmp: a SIGKILLed driver never deletes its own (``runtime/spark/scratch.py``), and pytest drops
    old runs' directories (it keeps the last three)."""
    from runtime.spark.scratch import scratch_env

    scratch = tmp_path_factory.mktemp("spark-scratch")
    os.environ.update(scratch_env(scratch))
    return scratch

NOT_MARKED_SPARK = "is not marked spark, so it may not start a JVM: mark it @pytest.mark.spark (tests/conftest.py)"


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("spark") is not None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if "alone" in getattr(item, "fixturenames", ()) and item.get_closest_marker("alone") is None:
            item.add_marker(pytest.mark.alone)  # scripts/test runs them in a phase of their own
    # Under pytest-xdist (scripts/test: --dist worksteal) the Spark tests go out first, then the other
    # slow ones. Worksteal gives each worker a contiguous quarter of this order and lets an idle one
    # take the back half of another's queue: the first worker starts on Spark tests while the others
    # run the quick ones, and the Spark tests spread as they steal. Stable, so every worker sees the
    # same order (xdist requires it). Tried and left (2026-11-26, fresh clones, 4 workers): the
    # longest first by measured seconds through --dist load one test at a time ran every Spark test
    # at once on all workers: 896 s against this order's 736 s (the JVMs' idle polling and
    # heartbeats cost CPU for as long as they wait, and they waited on one another).
    items.sort(key=lambda item: (item.get_closest_marker("spark") is None, item.get_closest_marker("slow") is None))


def pytest_configure(config: pytest.Config) -> None:
    name_the_run(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    remove_run_files(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test holds the machine shared, so that a timed section (the ``alone`` fixture) can have it
    to itself (``tests/machine_lock.py``)."""
    with held_shared():
        return (yield)


@pytest.fixture
def alone() -> Alone:
    """``with alone(): ...``: the section runs while no other worker runs a test (it times a server;
    the rest of the test runs beside the others). ``tests/machine_lock.py``."""
    return machine_to_myself


def pytest_runtest_setup(item: pytest.Item) -> None:
    # before the session-scoped spark (or Spark Connect server) fixture would start the JVM
    for name in ("spark", "connect_server"):
        if name in getattr(item, "fixturenames", ()) and item.get_closest_marker("spark") is None:
            pytest.fail(f"{item.nodeid} uses the {name} fixture but {NOT_MARKED_SPARK}", pytrace=False)


def _jvm_started() -> bool:
    """True once PySpark has launched its JVM gateway in this process."""
    context = sys.modules.get("pyspark.core.context") or sys.modules.get("pyspark.context")
    spark_context = getattr(context, "SparkContext", None)
    return getattr(spark_context, "_gateway", None) is not None


@pytest.fixture(scope="session")
def refusing_spark_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SPARK_HOME whose bin/spark-submit refuses to start Spark, saying why."""
    home = tmp_path_factory.mktemp("refusing-spark-home")
    (home / "bin").mkdir()
    submit = home / "bin" / "spark-submit"
    submit.write_text(f"#!/bin/sh\necho 'ftlayer tests: this test {NOT_MARKED_SPARK}' >&2\nexit 3\n")
    submit.chmod(0o755)
    return home


@pytest.fixture(autouse=True)
def _no_jvm_unless_marked_spark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if request.node.get_closest_marker("spark") is not None:
        yield
        return
    monkeypatch.setenv("SPARK_HOME", str(request.getfixturevalue("refusing_spark_home")))
    started_before = _jvm_started()
    yield
    if not started_before and _jvm_started():
        pytest.fail(f"{request.node.nodeid} started a JVM but {NOT_MARKED_SPARK}", pytrace=False)


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[EmbeddedServer | None]:
    if os.environ.get("FTLAYER_TEST_REDIS_URL"):
        yield None
        return
    server = EmbeddedServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server_url(embedded_server: EmbeddedServer | None) -> str:
    return os.environ.get("FTLAYER_TEST_REDIS_URL") or (embedded_server.url if embedded_server else "")


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def redis_client(redis_server_url: str, namespace: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server_url)
    yield client
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


@pytest.fixture
def ft_config(redis_server_url: str, namespace: str) -> FTConfig:
    # replays at once: tests that count replays should not wait out the default backoff
    return FTConfig(redis_url=redis_server_url, namespace=namespace, timeout_s=5.0, state_dir=TEMP_STATE_DIR,
                    replay_backoff_initial_s=0.0)


@pytest.fixture
def fake_redis() -> Any:
    fakeredis = pytest.importorskip("fakeredis")
    return fakeredis.FakeRedis()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from ftlayer.errors import FTLayerError
    from runtime.spark.session import local_session

    try:
        session = local_session("ftlayer-tests", log_level="ERROR")
    except FTLayerError as exc:  # java missing: say so clearly, do not skip
        pytest.fail(str(exc))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[Any]:
    from ftlayer.servers.cluster import EmbeddedCluster

    cluster = EmbeddedCluster(primaries=3, replicas=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """One real PostgreSQL server per test session (``EmbeddedPostgres``), started when a test asks."""
    from runtime.idempotent.pg_embedded import EmbeddedPostgres

    # a temporary directory under /tmp, not tmp_path: under root the server runs as another user,
    # who cannot enter pytest's 0700 base directory
    server = EmbeddedPostgres().start()
    yield server
    server.stop()


def _install_mosquitto() -> str:
    """Install the Mosquitto broker with apt-get (root only; one worker at a time); what was done."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root, or no apt-get: install it by hand (Debian/Ubuntu: apt-get install mosquitto)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(Path(tempfile.gettempdir()) / "ftlayer-tests-apt.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists():
            return "another test worker installed it"
        done = []
        for attempt in (["apt-get", "install", "-y", "-q", "mosquitto"], ["apt-get", "update", "-q"],
                        ["apt-get", "install", "-y", "-q", "mosquitto"]):
            run = subprocess.run(attempt, env=env, capture_output=True, text=True, check=False, timeout=600)
            done.append(f"{' '.join(attempt)} exited {run.returncode}: {(run.stdout + run.stderr).strip()[-400:]}")
            if run.returncode == 0 and attempt[1] == "install":
                break
        return "; ".join(done)


@pytest.fixture(scope="session")
def mosquitto_binary() -> Path:
    """The ``mosquitto`` binary, installed first if missing (see the module notes); the test fails without it."""
    from runtime.driver.mosquitto import MosquittoError, find_mosquitto

    try:
        return find_mosquitto()
    except MosquittoError as exc:
        missing = str(exc)
    what = _install_mosquitto()
    try:
        return find_mosquitto()
    except MosquittoError:
        pass
    pytest.fail(f"{missing}; the test set-up tried to install it and still finds no binary ({what})", pytrace=False)


@pytest.fixture
def mosquitto(mosquitto_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    """``mosquitto(**kw)`` starts an ``EmbeddedMosquitto(**kw)`` in a directory of its own; all are stopped after."""
    from runtime.driver.mosquitto import EmbeddedMosquitto

    started: list[EmbeddedMosquitto] = []

    def start(**kw: Any) -> EmbeddedMosquitto:
        broker = EmbeddedMosquitto(tmp_path_factory.mktemp("mosquitto"), **kw).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()

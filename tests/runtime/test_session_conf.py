"""spark.ftlayer.* keys of the running SparkSession reach the started topology (real Spark, real Redis)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.topology import Topology

pytestmark = pytest.mark.spark


@pytest.fixture
def session_key(spark: Any) -> Iterator[Any]:
    """Set spark.ftlayer.* keys on the shared session for one test, then unset them."""
    keys: list[str] = []

    def set_key(key: str, value: str) -> None:
        keys.append(key)
        spark.conf.set(key, value)

    yield set_key
    for key in keys:
        spark.conf.unset(key)


def _started(spark: Any, cfg: FTConfig, tmp_path: Path) -> tuple[FTConfig, FTConfig]:
    """(the config of the source's FTLayer, FTQuery.config) of a started topology."""
    topo = Topology("sessconf", cfg)
    topo.source("nums", range(10)).map(lambda x: x).sink(lambda values: None)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    try:
        return query.layers[0].config, getattr(query, "config", None) or query.layers[0].config
    finally:
        query.stop()


def test_session_conf_key_is_what_the_topology_uses(
    spark: Any, session_key: Any, redis_server_url: str, namespace: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FTLAYER_TIMEOUT_S", "7")  # env < Spark conf
    monkeypatch.setenv("FTLAYER_MAX_REPLAYS", "3")  # not in Spark conf: env stays
    session_key("spark.ftlayer.timeout_s", "61")
    cfg = FTConfig.load(env=None, redis_url=redis_server_url, namespace=namespace)
    assert cfg.timeout_s == 7
    layer_cfg, used = _started(spark, cfg, tmp_path)
    assert used.timeout_s == layer_cfg.timeout_s == 61.0
    assert used.max_replays == 3 and used.namespace == namespace


def test_option_set_in_code_beats_session_conf(
    spark: Any, session_key: Any, redis_server_url: str, namespace: str, tmp_path: Path
) -> None:
    session_key("spark.ftlayer.timeout_s", "61")
    session_key("spark.ftlayer.num_buckets", "4")
    cfg = FTConfig(redis_url=redis_server_url, namespace=namespace, timeout_s=5.0)
    used, _ = _started(spark, cfg, tmp_path)
    assert (used.timeout_s, used.num_buckets) == (5.0, 4)


def test_bad_session_conf_is_refused_naming_the_key(
    spark: Any, session_key: Any, redis_server_url: str, namespace: str, tmp_path: Path
) -> None:
    session_key("spark.ftlayer.timout_s", "61")
    with pytest.raises(ConfigError, match=r"spark\.ftlayer\.timout_s"):
        _started(spark, FTConfig(redis_url=redis_server_url, namespace=namespace), tmp_path)


def test_the_dataframe_path_takes_spark_conf_when_given_no_config(
    spark: Any, session_key: Any, redis_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DataFrame tour with no config argument on a session built with spark.ftlayer.namespace:
    every key lands under that namespace (it used to land under the default ``ftlayer``)."""
    import time
    import uuid

    import redis

    import ftlayer
    from runtime.dataframe import sources

    ns, topo = "dfconf" + uuid.uuid4().hex[:8], "dfconf" + uuid.uuid4().hex[:6]
    monkeypatch.chdir(tmp_path)  # no ftlayer.toml here
    monkeypatch.setenv("FTLAYER_REDIS_URL", redis_server_url)  # the environment names the server only
    monkeypatch.setenv("FTLAYER_TIMEOUT_S", "7")  # env < Spark conf
    session_key("spark.ftlayer.namespace", ns)
    session_key("spark.ftlayer.timeout_s", "41")
    rows: list[int] = []
    ftlayer.ingest(topo, "events", ({"i": i} for i in range(40)))
    df = ftlayer.read_stream(spark, topo, "events", schema="i long")
    query = (df.writeStream.foreachBatch(ftlayer.acking(lambda d, _b: rows.extend(r["i"] for r in d.collect())))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="300 milliseconds").start())
    handle = sources.source(topo, "events")
    client = redis.Redis.from_url(redis_server_url)
    try:
        deadline = time.monotonic() + 120
        while handle.stats()["acked"] < 40:
            assert time.monotonic() < deadline, handle.stats()
            assert query.exception() is None, query.exception()
            time.sleep(0.2)
        assert handle.config.namespace == ns and handle.config.timeout_s == 41.0
        assert sorted(rows) == list(range(40))
        keys = [k.decode() for k in client.scan_iter(match=f"*{topo}*", count=1000)]
        assert keys and all(k.startswith(f"{ns}:") for k in keys), keys
    finally:
        query.stop()
        handle.stop()
        for key in client.scan_iter(match=f"{ns}:*", count=1000):
            client.delete(key)


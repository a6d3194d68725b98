"""runtime/spark/conf.py: an embedded server (no redis_url) only on a local Spark master; the session's
``spark.ftlayer.*`` keys read in one JVM call on a classic session."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.spark.conf import _classic_conf, check_reachable_redis, ftlayer_conf


def test_non_local_master_without_redis_url_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"redis_url is empty but spark.master is 'spark://h:7077'.*127\.0\.0\.1"):
        check_reachable_redis("spark://h:7077", FTConfig())
    with pytest.raises(ConfigError, match="yarn"):
        check_reachable_redis("yarn", FTConfig())
    check_reachable_redis("local[2,4]", FTConfig())
    check_reachable_redis("yarn", FTConfig(redis_url="redis://redis.internal:6379/0"))


class _JConf:
    def __init__(self, conf: dict[str, str]) -> None:
        self.conf = conf

    def getAllAsJava(self) -> dict[str, str]:
        return self.conf


class _ObjectMapper:
    calls = 0

    def writeValueAsString(self, value: dict[str, str]) -> str:
        _ObjectMapper.calls += 1
        return json.dumps(value)


class _RefusedGetAll:
    def __init__(self, conf: dict[str, str]) -> None:
        self._jconf = _JConf(conf)

    @property
    def getAll(self) -> dict[str, str]:
        raise AssertionError("the key-by-key proxy path was taken")


def test_a_classic_session_s_conf_is_read_in_one_jvm_call() -> None:
    conf = {"spark.ftlayer.timeout_s": "7", "spark.master": "local[2]", "spark.ftlayer.namespace": "a=b, c"}
    jvm = SimpleNamespace(com=SimpleNamespace(fasterxml=SimpleNamespace(jackson=SimpleNamespace(
        databind=SimpleNamespace(ObjectMapper=_ObjectMapper)))))
    session = SimpleNamespace(_jvm=jvm, conf=_RefusedGetAll(conf))
    before = _ObjectMapper.calls
    assert ftlayer_conf(session) == {"spark.ftlayer.timeout_s": "7", "spark.ftlayer.namespace": "a=b, c"}
    assert _ObjectMapper.calls == before + 1


def test_a_session_without_a_jvm_reads_getall() -> None:
    # Spark Connect: no _jvm, conf.getAll over Connect
    session = SimpleNamespace(conf=SimpleNamespace(getAll={"spark.ftlayer.timeout_s": "3", "spark.app.name": "x"}))
    assert ftlayer_conf(session) == {"spark.ftlayer.timeout_s": "3"}


@pytest.mark.spark
@pytest.mark.slow
def test_the_one_call_read_gives_what_getall_gives_on_a_real_session(spark: Any) -> None:
    values = {"spark.ftlayer.probe_plain": "7", "spark.ftlayer.probe_odd": 'a=b, {"c": [1]}\nline two "q" é'}
    try:
        for key, value in values.items():
            spark.conf.set(key, value)
        via_proxy = {k: v for k, v in dict(spark.conf.getAll).items() if k.startswith("spark.ftlayer.")}
        assert _classic_conf(spark) is not None  # the one-call path works on this Spark
        assert ftlayer_conf(spark) == via_proxy
        assert {k: ftlayer_conf(spark)[k] for k in values} == values
    finally:
        for key in values:
            spark.conf.unset(key)

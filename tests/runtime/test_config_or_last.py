"""A config given without redis_url to the acking points and row functions is resolved, not shipped bare.

Before this, ``ftlayer.acking(write, config=FTConfig.load())`` (no URL: the embedded server)
could not settle a single batch: every record timed out and was replayed (found by
``scripts/demo dataframe``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.dataframe.sources import config_or_last


def test_a_config_without_url_gets_the_embedded_servers(tmp_path: Path) -> None:
    cfg = FTConfig(state_dir=str(tmp_path / "state"), namespace="cfgres")
    got = config_or_last(cfg)
    assert got.redis_url.startswith("redis://")
    assert redis.Redis.from_url(got.redis_url).ping()
    assert config_or_last(cfg).redis_url == got.redis_url  # the same server every time


def test_a_config_with_url_is_kept(redis_server_url: str) -> None:
    cfg = FTConfig(redis_url=redis_server_url, namespace="cfgres")
    assert config_or_last(cfg) is cfg


def test_a_non_local_master_without_redis_url_is_refused_by_the_dataframe_path(tmp_path: Path) -> None:
    """Executors on other hosts cannot reach an embedded server on the driver: refused when the
    source is opened, naming the option to set (the Topology path refuses it the same way)."""
    from runtime.dataframe import sources

    class Conf:
        def get(self, key: str, default: Any = None) -> Any:
            return "spark://cluster:7077" if key == "spark.master" else default

        def getAll(self) -> dict[str, str]:
            return {"spark.master": "spark://cluster:7077"}

    class Session:
        conf = Conf()

    cfg = FTConfig(state_dir=str(tmp_path / "state"), namespace="remote")
    with pytest.raises(ConfigError, match=re.escape("redis_url is empty but spark.master is 'spark://cluster:7077'")):
        sources.source("remote", "events", config=cfg, spark=Session())
    assert not (tmp_path / "state").exists()  # no embedded server was started

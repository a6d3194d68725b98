"""A config given without redis_url to the acking points and row functions is resolved, not shipped bare.

Before this, ``ftlayer.acking(write, config=FTConfig.load())`` (no URL: the embedded server)
could not settle a single batch: every record timed out and was replayed (found by
``scripts/demo dataframe``).
"""

from __future__ import annotations

from pathlib import Path

import redis

from ftlayer.config import FTConfig
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

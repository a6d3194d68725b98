"""runtime/spark/conf.py: an embedded server (no redis_url) only on a local Spark master."""

from __future__ import annotations

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.spark.conf import check_reachable_redis


def test_non_local_master_without_redis_url_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"redis_url is empty but spark.master is 'spark://h:7077'.*127\.0\.0\.1"):
        check_reachable_redis("spark://h:7077", FTConfig())
    with pytest.raises(ConfigError, match="yarn"):
        check_reachable_redis("yarn", FTConfig())
    check_reachable_redis("local[2,4]", FTConfig())
    check_reachable_redis("yarn", FTConfig(redis_url="redis://redis.internal:6379/0"))

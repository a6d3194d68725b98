"""FTConfig, the one frozen, validated configuration object, and the names that go with it.

The options and their checks are :mod:`ftlayer.config.options`; where values come from (TOML
file, ``FTLAYER_*`` env, ``spark.ftlayer.*`` Spark conf) is :mod:`ftlayer.config.sources`.
"""

from ftlayer.config.options import DURABILITY_MODES, STATUSES, TEMP_STATE_DIR, FTConfig
from ftlayer.config.redis_url import mask_url
from ftlayer.config.sources import CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE, ENV_PREFIX, SPARK_PREFIX, parse_bool

__all__ = [
    "CONFIG_FILE_ENV",
    "DEFAULT_CONFIG_FILE",
    "DURABILITY_MODES",
    "ENV_PREFIX",
    "SPARK_PREFIX",
    "STATUSES",
    "TEMP_STATE_DIR",
    "FTConfig",
    "mask_url",
    "parse_bool",
]

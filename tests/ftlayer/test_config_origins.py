"""FTConfig remembers options set in code, applies Spark conf to the others, and says where values came from."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError


def test_options_set_in_code_are_remembered_through_replace_load_and_pickle() -> None:
    cfg = FTConfig(timeout_s=5.0)
    assert cfg.explicit_options == {"timeout_s"}
    assert cfg.replace(namespace="x").explicit_options == {"timeout_s", "namespace"}
    assert pickle.loads(pickle.dumps(cfg)).explicit_options == {"timeout_s"}
    loaded = FTConfig.load(env={"FTLAYER_NUM_BUCKETS": "4"}, max_replays=2)
    assert loaded.explicit_options == {"max_replays"}  # env values are not "set in code"


def test_with_spark_conf_skips_options_set_in_code() -> None:
    conf = {"spark.ftlayer.timeout_s": "61", "spark.ftlayer.num_buckets": "4", "spark.sql.x": "1"}
    cfg = FTConfig.load(env={"FTLAYER_TIMEOUT_S": "7"}).with_spark_conf(conf)
    assert (cfg.timeout_s, cfg.num_buckets) == (61.0, 4)
    cfg = FTConfig(timeout_s=5.0).with_spark_conf(conf)
    assert (cfg.timeout_s, cfg.num_buckets) == (5.0, 4)
    assert cfg.explicit_options == {"timeout_s"}
    plain = FTConfig()
    assert plain.with_spark_conf({}) is plain
    with pytest.raises(ConfigError, match=r"num_buckets=1 \(from Spark conf spark\.ftlayer\.num_buckets\)"):
        plain.with_spark_conf({"spark.ftlayer.num_buckets": "1"})


def test_explain_gives_each_origin_and_errors_name_theirs(tmp_path: Path) -> None:
    path = tmp_path / "f.toml"
    path.write_text("max_replays = 9\nnum_buckets = 1\n")
    with pytest.raises(ConfigError, match=rf"num_buckets=1 \(from file {path}\)"):
        FTConfig.load(path, env={})
    path.write_text("max_replays = 9\n")
    cfg, origins = FTConfig.explain(path, env={"FTLAYER_TIMEOUT_S": "3"}, spark_conf={"spark.ftlayer.namespace": "s"},
                                    overrides_origin="command line", durability="none")
    assert origins["max_replays"] == f"file {path}" and origins["timeout_s"] == "env FTLAYER_TIMEOUT_S"
    assert origins["namespace"] == "Spark conf spark.ftlayer.namespace" and origins["durability"] == "command line"
    assert origins["num_channels"] == "default" and cfg.durability == "none"
    with pytest.raises(ConfigError, match=r"num_channels='x' \(from env FTLAYER_NUM_CHANNELS\): expected an integer"):
        FTConfig.load(env={"FTLAYER_NUM_CHANNELS": "x"})


def test_bad_redis_url_is_shown_unless_it_holds_a_password() -> None:
    with pytest.raises(ConfigError, match="'localhost:6379'"):
        FTConfig(redis_url="localhost:6379")
    for url in ("http://u:pw1@h:1/0", "u:pw1@h:6379"):
        with pytest.raises(ConfigError) as err:
            FTConfig(redis_url=url)
        assert "pw1" not in str(err.value) and "***" in str(err.value)

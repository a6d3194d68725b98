from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError


def test_defaults_are_valid_and_picklable() -> None:
    cfg = FTConfig()
    assert cfg.ft_on and cfg.durability == "everysec"
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert cfg.rotation_interval_s == pytest.approx(cfg.timeout_s / (cfg.num_buckets - 1))


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("num_buckets", 1, ">= 2"),
        ("timeout_s", 0, "> 0"),
        ("timeout_s", float("nan"), "> 0"),
        ("durability", "always", "'none', 'everysec', 'waitaof'"),
        ("status", "maybe", "'on', 'off'"),
        ("max_replays", -1, ">= 0"),
        ("namespace", "a b", "letters"),
        ("flush_batch_size", 0, "from 1"),
        ("redis_url", "http://x", "redis://"),
        ("num_channels", "4", "int"),
    ],
)
def test_bad_values_name_option_value_and_allowed(option: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        FTConfig(**{option: value})  # type: ignore[arg-type]
    text = str(err.value)
    assert option in text and allowed in text


def test_precedence_file_env_spark(tmp_path: Path) -> None:
    path = tmp_path / "ftlayer.toml"
    path.write_text('[ftlayer]\ntimeout_s = 12.5\nnum_buckets = 4\nnamespace = "fromfile"\nmax_replays = 9\n')
    env = {"FTLAYER_NUM_BUCKETS": "5", "FTLAYER_NAMESPACE": "fromenv"}
    spark_conf = {"spark.ftlayer.namespace": "fromspark", "spark.other": "ignored"}
    cfg = FTConfig.load(path, env=env, spark_conf=spark_conf)
    assert (cfg.timeout_s, cfg.num_buckets, cfg.namespace, cfg.max_replays) == (12.5, 5, "fromspark", 9)


def test_config_file_from_env_and_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("timeout_s = 3\n")
    assert FTConfig.load(env={"FTLAYER_CONFIG": str(path)}).timeout_s == 3
    path.write_text("timeout = 3\n")
    with pytest.raises(ConfigError, match="timeout"):
        FTConfig.load(path, env={})
    with pytest.raises(ConfigError, match=r"spark\.ftlayer\.timeut_s"):
        FTConfig.load(env={}, spark_conf={"spark.ftlayer.timeut_s": "1"})


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="FTLAYER_TIMEOUT_S"):
        FTConfig.load(env={"FTLAYER_TIMEOUT_S": "soon"})


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        FTConfig.load(tmp_path / "nope.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("timeout_s = = 1")
    with pytest.raises(ConfigError, match="not valid TOML"):
        FTConfig.load(bad, env={})


def test_every_option_is_documented() -> None:
    for name, env, spark_key, doc in FTConfig().describe():
        assert env == "FTLAYER_" + name.upper() and spark_key == "spark.ftlayer." + name
        assert len(doc) > 20

"""Source options in Spark's camelCase and in ftlayer's snake_case (runtime.spark.option_names)."""

from __future__ import annotations

from typing import Any

import pytest

from ftlayer.errors import ConfigError
from runtime.spark.feed_source import FeedOptions
from runtime.spark.ft_source import FTSourceOptions
from runtime.spark.option_names import SourceOptionMap, camel_case, option_key

SNAKE = {"redis_url": "redis://127.0.0.1:1/0", "namespace": "ns", "topology": "t", "source": "s",
         "num_channels": "3", "max_records_per_batch": "40", "read_page_entries": "9", "num_shards": "2",
         "connect_timeout_s": "2.5", "outage_budget_s": "30", "freeze_worker_heap": "false",
         "max_batch_s": "7", "hold_lease_s": "4"}


def test_camel_case_and_any_case_are_the_same_option() -> None:
    assert camel_case("max_records_per_batch") == "maxRecordsPerBatch"
    assert option_key("maxRecordsPerBatch") == option_key("MAX_RECORDS_PER_BATCH") == option_key("maxrecordsperbatch")
    opts = SourceOptionMap({"maxRecordsPerBatch": 5}, "test")
    assert opts["max_records_per_batch"] == "5" and "MaxRecordsPerBatch" in opts and "max_records" not in opts


def test_the_ft_source_reads_camel_case_exactly_as_snake_case() -> None:
    camel = {camel_case(k): v for k, v in SNAKE.items()}
    assert "redisUrl" in camel and "numChannels" in camel
    assert FTSourceOptions.parse(camel) == FTSourceOptions.parse(SNAKE)
    parsed = FTSourceOptions.parse(camel)
    assert (parsed.num_channels, parsed.max_records_per_batch, parsed.num_shards, parsed.max_batch_s,
            parsed.freeze_worker_heap) == (3, 40, 2, 7.0, False)


def test_one_option_spelled_twice_with_different_values_is_refused() -> None:
    both: dict[str, Any] = {**SNAKE, "numChannels": "4"}
    with pytest.raises(ConfigError, match=r"'num_channels'='3' and 'numChannels'='4' are the same option"):
        FTSourceOptions.parse(both)
    FTSourceOptions.parse({**SNAKE, "numChannels": "3"})  # the same value twice is one option


def test_a_missing_option_is_named_in_both_spellings() -> None:
    with pytest.raises(ConfigError, match=r"'numChannels' \(num_channels\) is required"):
        FTSourceOptions.parse({k: v for k, v in SNAKE.items() if k != "num_channels"})


def test_the_feed_source_reads_camel_case() -> None:
    opts = {"address": "127.0.0.1:9", "token": "x", "feedId": "f", "numChannels": "2", "maxRecordsPerBatch": "8"}
    parsed = FeedOptions.parse(opts)
    assert (parsed.feed_id, parsed.num_channels, parsed.max_records_per_batch) == ("f", 2, 8)

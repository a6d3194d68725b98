"""One channel-source base for the FT, feed and typed sources: the fixed schema, the refusal of
another, the read limit and the AvailableNow target are the base's, the same for each source."""

from __future__ import annotations

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.driver.feed import Feed, FeedDestination, FeedServer
from runtime.driver.ingest import Ingestor
from runtime.spark.channel_source import ChannelPartition, ChannelSource, ChannelStreamReader
from runtime.spark.feed_source import FeedPartition, FeedSource, FeedStreamReader, feed_options
from runtime.spark.ft_data_sources import FTDataSource, FTSource
from runtime.spark.ft_source import FTPartition, FTStreamReader, source_options
from runtime.spark.row_contract import SOURCE_ROW
from runtime.spark.typed_source import TypedStreamReader


def test_every_source_is_a_channel_source_of_the_source_row() -> None:
    for source in (FTSource, FeedSource, FTDataSource):
        assert issubclass(source, ChannelSource)
        assert SOURCE_ROW.same_struct(source({}).schema())
    for reader in (FTStreamReader, FeedStreamReader, TypedStreamReader):
        assert issubclass(reader, ChannelStreamReader)
    for partition in (FTPartition, FeedPartition):
        assert issubclass(partition, ChannelPartition)
    assert FTSource.name() == "ftlayer" and FeedSource.name() == "ftlayer_feed"


def test_a_schema_other_than_the_source_row_is_refused_naming_the_source(redis_server_url: str) -> None:
    other = StructType([StructField("sid", LongType())])
    options = source_options(FTConfig(redis_url=redis_server_url), "t", "s", 2)
    with pytest.raises(ConfigError, match="the FT source has the fixed schema 'sid long, cid long"):
        FTSource(options).streamReader(other)
    server = FeedServer(Feed(2)).start()
    try:
        with pytest.raises(ConfigError, match="the feed source has the fixed schema 'sid long, cid long"):
            FeedSource(feed_options(server)).streamReader(other)
    finally:
        server.stop()


def test_the_base_gives_the_read_limit_the_available_now_target_and_the_reported_tails() -> None:
    server = FeedServer(Feed(2)).start()
    try:
        Ingestor(FeedDestination(server.feed, FTConfig(status="off")), range(10)).run()
        reader = FeedSource(feed_options(server, max_records_per_batch=4)).streamReader(SOURCE_ROW.struct_type())
        assert type(reader.getDefaultReadLimit()).__name__ == "ReadMaxRows"
        assert reader.getDefaultReadLimit().max_rows == 4
        unlimited = FeedSource(feed_options(server)).streamReader(SOURCE_ROW.struct_type())
        assert type(unlimited.getDefaultReadLimit()).__name__ == "ReadAllAvailable"
        assert list(reader.channels) == [0, 1]
        tails = reader.tails()
        assert reader.reportLatestOffset() == tails and tails["ch0"] + tails["ch1"] == 10
        reader.prepareForTriggerAvailableNow()
        Ingestor(FeedDestination(server.feed, FTConfig(status="off")), range(10)).run()
        # the target stays at the tails when AvailableNow began; the reported tails move on
        end = reader.latestOffset(reader.initialOffset(), None)
        assert end == tails and reader.reportLatestOffset() != tails
    finally:
        server.stop()

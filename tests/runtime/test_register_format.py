"""``format("ftlayer")`` read directly, with Spark-style camelCase options, after the documented
one-liner ``ftlayer.register_format(spark)`` (issue 31 item 3)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import ftlayer
from ftlayer.config import FTConfig
from runtime.dataframe import sources
from tests.waiting import wait_until

pytestmark = pytest.mark.spark


def test_format_ftlayer_reads_with_camel_case_options(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    name = "rf" + uuid.uuid4().hex[:8]
    handle = sources.source(name, "events", config=ft_config, num_channels=2)
    try:
        handle.ingest({"i": i, "user": f"u{i % 5}"} for i in range(60))
        wait_until(lambda: handle.stats()["persisted"] == 60, 60, "60 records persisted")
        ftlayer.register_format(spark)
        ftlayer.register_format(spark)  # safe to repeat
        df = (spark.readStream.format("ftlayer")
              .option("redisUrl", ft_config.redis_url).option("namespace", ft_config.namespace)
              .option("topology", name).option("source", "events").option("numChannels", "2")
              .option("maxRecordsPerBatch", "25")  # without it, the one batch of 60
              .schema("i long, user string").load())
        rows: list[int] = []
        query = (df.select("i").writeStream.trigger(availableNow=True)
                 .foreachBatch(lambda batch, _id: rows.extend(r["i"] for r in batch.collect()))
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        assert query.awaitTermination(120)
        assert query.exception() is None
        assert sorted(rows) == list(range(60))
        progress = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        # maxRecordsPerBatch was read: the cap, split over the channels, may round up by one per channel
        assert max(progress) <= 25 + 2 and len(progress) >= 3, progress
    finally:
        handle.stop()

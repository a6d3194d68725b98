"""Spark >= 4.0: admission control is detected at run time, with a fallback where pyspark lacks it.

pyspark 4.0 has no ``pyspark.sql.streaming.datasource`` and calls ``latestOffset()`` with no
arguments. These tests hide that module (as on 4.0), re-import the FT and feed sources, and
drive the reader the way the 4.0 source runner does, against a real Redis. The installed
pyspark (4.3) path is covered by test_ft_source.py through Spark itself.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.layer import FTLayer
from serialization.serializers import make_record

MODULES = ("runtime.spark.admission", "runtime.spark.ft_source", "runtime.spark.feed_source")


@pytest.fixture
def without_admission_control(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    importlib.import_module("pyspark.sql.datasource")  # 4.3's imports the hidden module; 4.0's does not
    monkeypatch.setitem(sys.modules, "pyspark.sql.streaming.datasource", None)  # import fails, as on 4.0
    try:
        yield {name.rsplit(".", 1)[1]: importlib.reload(importlib.import_module(name)) for name in MODULES}
    finally:
        monkeypatch.undo()
        for name in MODULES:
            importlib.reload(importlib.import_module(name))


def test_sources_import_and_read_without_admission_control(
    without_admission_control: dict[str, Any], ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    admission, ft_source = without_admission_control["admission"], without_admission_control["ft_source"]
    assert admission.HAS_ADMISSION_CONTROL is False
    layer = FTLayer(ft_config, "adm", "src", num_channels=2).open()
    layer.persist([make_record(layer, {"i": i}, key=f"k{i}") for i in range(30)])
    options = {"redis_url": ft_config.redis_url, "namespace": ft_config.namespace, "topology": "adm",
               "source": "src", "num_channels": "2", "max_records_per_batch": "5"}
    reader = ft_source.FTSource(options).streamReader(ft_source.source_schema())
    start = reader.initialOffset()
    end = reader.latestOffset()  # what pyspark 4.0's runner calls: no start, no limit
    assert end == reader.tails()  # every record available (no cap without admission control)
    rows = [row for p in reader.partitions(start, end) for b in reader.read(p) for row in b.to_pylist()]
    assert len(rows) == 30
    reader.commit(end)
    feed_reader = without_admission_control["feed_source"].FeedStreamReader
    assert "limit" in inspect.signature(feed_reader.latestOffset).parameters


def test_installed_pyspark_gets_admission_control() -> None:
    from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow

    from runtime.spark import admission
    from runtime.spark.ft_source import FTStreamReader

    assert admission.HAS_ADMISSION_CONTROL
    assert issubclass(FTStreamReader, SupportsTriggerAvailableNow)
    # the 4.1+ runner turns admission control on when latestOffset takes parameters
    assert len(inspect.signature(FTStreamReader.latestOffset).parameters) == 3
    assert admission.max_rows(ReadMaxRows(7)) == 7 and admission.max_rows(admission.read_all()) is None
    assert admission.read_max_rows(7) == ReadMaxRows(7)

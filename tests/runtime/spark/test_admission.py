"""Spark >= 4.0: admission control is detected at run time, with a fallback where pyspark lacks it.

pyspark 4.0 has no ``pyspark.sql.streaming.datasource`` and calls ``latestOffset()`` with no
arguments. The first test hides that module (as on 4.0) in a fresh interpreter, imports the FT
and feed sources, and drives the reader the way the 4.0 source runner does, against a real Redis. The installed
pyspark (4.3) path is covered by test_ft_source.py through Spark itself.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from serialization.serializers import make_record

ROOT = Path(__file__).resolve().parents[3]

# runs in its own interpreter: the sources are imported with the admission module hidden, as on
# pyspark 4.0 (re-importing them in the test process would swap the classes other tests hold)
AS_ON_4_0 = """
import inspect, json, sys
import pyspark.sql.datasource  # 4.3's imports the hidden module; 4.0's does not have it to import
sys.modules["pyspark.sql.streaming.datasource"] = None
from runtime.spark import admission, feed_source, ft_data_sources, ft_source
url, ns = sys.argv[1], sys.argv[2]
options = {"redis_url": url, "namespace": ns, "topology": "adm", "source": "src", "num_channels": "2",
           "max_records_per_batch": "5"}
reader = ft_data_sources.FTSource(options).streamReader(ft_source.source_schema())
start = reader.initialOffset()
end = reader.latestOffset()  # what pyspark 4.0's runner calls: no start, no limit
rows = [r for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()]
reader.commit(end)
feed_params = inspect.signature(feed_source.FeedStreamReader.latestOffset).parameters
print(json.dumps({"has": admission.HAS_ADMISSION_CONTROL, "rows": len(rows), "tails": end == reader.tails(),
                  "feed_limit_param": "limit" in feed_params}))
"""


def test_sources_import_and_read_without_admission_control(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = FTLayer(ft_config, "adm", "src", num_channels=2).open()
    layer.persist([make_record(layer, {"i": i}, key=f"k{i}") for i in range(30)])
    proc = subprocess.run([sys.executable, "-c", AS_ON_4_0, ft_config.redis_url, ft_config.namespace],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # no admission control detected; every record available in one batch (no cap), read and committed
    assert got == {"has": False, "rows": 30, "tails": True, "feed_limit_param": True}


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

"""The FT source reads a big backlog in bounded server calls, each record once (issue 13, item 7)."""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from tests.ftlayer.script_latency import ScriptTimes
from tests.ftlayer.scripting.test_bounded_scripts import persist_raw
from tests.machine_lock import Alone
from tests.runtime.spark.test_ft_source import CHANNELS, SRC, TOPO, read_partition, reader_for


@pytest.mark.slow
def test_reader_reads_200k_records_in_big_entries_in_bounded_calls(
    ft_config: FTConfig, redis_client: redis.Redis, alone: Alone
) -> None:
    layer = FTLayer(ft_config, TOPO, SRC, num_channels=CHANNELS).open()
    # 20,000 records per persist call, as flush_batch_size wrote them: 10,000 ids per stream entry
    sids = persist_raw(layer, 200_000, channel=None, num_channels=CHANNELS)
    reader = reader_for(ft_config)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    with alone():  # timed (tests/machine_lock.py)
        times = ScriptTimes(redis_client).start()
        try:
            rows = [row for p in reader.partitions(start, end) for row in read_partition(reader, p)]
            slow = times.max_ms()
        finally:
            times.stop()
    print(f"\nreader over 200k records: slowest script calls (ms): {slow}")
    counts = Counter(r["sid"] for r in rows)
    assert set(counts) == set(sids) and max(counts.values()) == 1
    assert slow.get("READ_CHANNEL", 0.0) < 100.0, slow

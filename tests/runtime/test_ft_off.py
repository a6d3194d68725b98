"""FT status 'off' on real local Spark: same output as FT on, no persistence, no Redis traffic at all."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, FailRecord
from ftlayer.records.keyhash import key_hash
from runtime.driver.feed import Feed, FeedDestination, FeedServer
from runtime.driver.ingest import Ingestor
from runtime.sinks import ForeachBatchSink, JsonLinesSink
from runtime.spark.feed_source import FeedSource, FeedStreamReader, feed_schema
from runtime.spark.handlers import handler_for
from runtime.spark.row_batch import RowBatch
from runtime.topology import Topology
from serialization.payload import unpack_payload
from tests.runtime.test_topology_e2e import clicks, run_to_drain

N = 3000


def keyed_topology(cfg: FTConfig, out: JsonLinesSink) -> Topology:
    """The topology of test_keyed_pipeline_delivers_every_record_and_leaves_nothing."""
    topo = Topology("e2e", cfg)
    (
        topo.source("clicks", clicks(N))
        .map(lambda e: {**e, "parsed": True})
        .filter(lambda e: not e["bot"])
        .key_by(lambda e: e["user"])
        .map(lambda e: {**e, "enriched": len(e["user"])})
        .sink(out)
    )
    return topo


def command_calls(client: redis.Redis) -> Counter[str]:
    """Calls per command since the server started (INFO commandstats)."""
    stats: dict[str, Any] = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def check_keyed_output(lines: list[Any], num_channels: int) -> Counter[int]:
    assert all(line["value"]["enriched"] == len(line["value"]["user"]) for line in lines)
    parts: dict[str, set[int]] = defaultdict(set)
    for line in lines:
        parts[line["value"]["user"]].add(line["partition"])
    for user, seen in parts.items():
        assert seen == {key_hash(user) % num_channels}, user
    return Counter(line["value"]["i"] for line in lines)


@pytest.mark.spark
def test_ft_off_same_output_as_ft_on_and_no_redis_traffic(
    spark: Any, ft_config: FTConfig, redis_client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    cfg = ft_config.replace(timeout_s=30.0)
    expected = {i for i in range(N) if i % 10 != 3}

    # FT off first, so that nothing left over from an FT-on run can reach the server meanwhile
    off_out = JsonLinesSink(tmp_path / "off")
    before = command_calls(redis_client)
    query = keyed_topology(cfg.replace(status="off"), off_out).start(
        spark, checkpoint_location=str(tmp_path / "ckpt-off"), trigger_interval_s=0.2
    )
    run_to_drain(query)
    after = command_calls(redis_client)
    delta = {cmd: n for cmd, n in (after - before).items() if n}
    assert delta == {"info": 1}, f"FT off issued Redis commands: {delta}"
    assert list(redis_client.scan_iter(match=f"{namespace}:*")) == []
    assert query.layers == [] and query.service is None
    stats = query.stats()["clicks"]
    assert stats["ingested"] == N and stats["committed"] == N and stats["pending"] == 0
    assert stats["rows_served"] == N and stats["buffered_bytes"] == 0  # read once each, all dropped
    off = check_keyed_output(off_out.read_all(), cfg.num_channels)
    assert set(off) == expected and set(off.values()) == {1}  # no failures: exactly once

    on_out = JsonLinesSink(tmp_path / "on")
    query = keyed_topology(cfg, on_out).start(spark, checkpoint_location=str(tmp_path / "ckpt-on"),
                                              trigger_interval_s=0.2)
    run_to_drain(query)
    on = check_keyed_output(on_out.read_all(), cfg.num_channels)
    assert set(on) == set(off)
    assert query.layers[0].stats()["acked"] == N and query.layers[0].leftovers() == []


@pytest.mark.spark
def test_fail_record_with_ft_off_drops_the_record_and_the_query_keeps_running(
    spark: Any, ft_config: FTConfig, redis_client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    n = 800
    calls = tmp_path / "calls"
    calls.mkdir()
    batches: list[list[Any]] = []

    def flaky(e: dict[str, Any]) -> dict[str, Any]:
        if e["i"] % 40 == 0:
            (calls / f"{e['i']}-{os.getpid()}-{uuid.uuid4().hex}").touch()  # one file per call
            raise FailRecord("dropped with FT off")
        return {"i": e["i"], "user": e["user"]}

    topo = Topology("offfail", ft_config.replace(status="off", redis_url="", namespace=namespace))
    # a driver-side sink: with FT off it gets the values and acks nothing
    topo.source("clicks", clicks(n), key=lambda e: e["user"]).map(flaky).sink(
        ForeachBatchSink(lambda values, batch_id: batches.append(values))
    )
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    try:
        assert query.await_drained(180), query.stats()
        query.query.processAllAvailable()
        assert query.query.isActive and query.query.exception() is None
    finally:
        query.stop()
    delivered = Counter(v["i"] for batch in batches for v in batch)
    failing = {i for i in range(n) if i % 40 == 0}
    assert set(delivered) == set(range(n)) - failing and set(delivered.values()) == {1}
    # each failing record reached the user function exactly once: nothing was replayed
    assert Counter(int(p.name.split("-")[0]) for p in calls.iterdir()) == dict.fromkeys(failing, 1)
    assert query.stats()["clicks"]["committed"] == n
    assert query.stats()["clicks"]["dropped_fail_record"] == len(failing)  # counted on the driver
    assert list(redis_client.scan_iter(match=f"{namespace}:*")) == []


def test_non_ft_handler_drops_and_counts_fail_record() -> None:
    def fn(v: int) -> list[int]:
        if v % 3 == 0:
            raise FailRecord("x")
        return [v]

    handler = handler_for(False, 1)
    rows = RowBatch.from_rows([(0, i, i, i, i, 0) for i in range(10)])
    out = [row[4] for row in handler.process_batch(rows, fn).rows()]
    assert out == [1, 2, 4, 5, 7, 8] and handler.failed == 4


def _reader(server: FeedServer, **extra: str) -> FeedStreamReader:
    options = {"address": server.address, "token": server.token, "feed_id": server.feed.feed_id,
               "num_channels": str(server.feed.num_channels), **extra}
    reader = FeedSource(options).streamReader(feed_schema())
    assert isinstance(reader, FeedStreamReader)
    return reader


def _read(reader: FeedStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[int, Any]]:
    rows = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            for row in batch.to_pylist():
                assert row["channel"] == part.channel and row["sid"] == row["cid"] == row["origin"]
                rows.append((row["channel"], unpack_payload(row["payload"])))
    return rows


def test_feed_reader_ranges_limits_commits_and_feed_ids() -> None:
    cfg = FTConfig(status="off", flush_batch_size=70)
    server = FeedServer(Feed(3)).start()
    try:
        Ingestor(FeedDestination(server.feed, cfg), range(600)).run()  # round-robin: 200 per channel
        reader = _reader(server, max_records_per_batch="90")
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert [end[f"ch{c}"] for c in range(3)] == [30, 30, 30]  # ceil(90 / 3) per channel
        first = _read(reader, start, end)
        assert len(first) == 90 and len(_read(reader, start, end)) == 90  # a task retry re-reads
        end2 = reader.latestOffset(end, ReadAllAvailable())  # commits `end` in the same round trip
        assert server.feed.stats()["committed"] == 90 and _read(reader, start, end) == []
        rest = _read(reader, end, end2)
        assert sorted(v for _, v in first + rest) == list(range(600))
        reader.commit(end2)
        assert server.feed.stats() | {"reads": 0} == {
            "ingested": 600, "committed": 600, "pending": 0, "buffered_bytes": 0, "reads": 0, "rows_served": 690}
        # offsets of another feed (a restarted driver) read nothing and commit nothing
        stale = {**end2, "feed": "old"}
        assert _read(reader, reader.initialOffset() | {"feed": "old"}, stale) == []
        Ingestor(FeedDestination(server.feed, cfg), range(3)).run()
        assert reader.latestOffset(stale, ReadMaxRows(3)) == {"feed": server.feed.feed_id, "ch0": 1,
                                                              "ch1": 1, "ch2": 1}
    finally:
        server.stop()


def test_feed_backpressure_waits_for_commits() -> None:
    cfg = FTConfig(status="off", flush_batch_size=10, max_pending=50)
    server = FeedServer(Feed(2)).start()
    try:
        ing = Ingestor(FeedDestination(server.feed, cfg), range(200), linger_s=0.001).start()
        time.sleep(0.3)
        assert 50 <= server.feed.pending() <= 60 and not ing.done
        reader = _reader(server)
        start = reader.initialOffset()
        deadline = time.monotonic() + 20
        while not ing.done and time.monotonic() < deadline:
            end = reader.latestOffset(start, ReadAllAvailable())
            reader.commit(end)
            start = end
            time.sleep(0.01)
        assert ing.done and server.feed.stats()["ingested"] == 200
    finally:
        server.stop()


def test_feed_server_refuses_bad_requests_and_lives_on() -> None:
    import socket
    import struct

    server = FeedServer(Feed(1)).start()
    try:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:  # a frame far too large
            sock.sendall(struct.pack(">I", 1 << 30))
            assert sock.recv(16) == b""  # closed without an answer
        with socket.create_connection((host, int(port)), timeout=5) as sock:  # not msgpack
            sock.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
            assert sock.recv(16) == b""
        wrong = _reader(server)
        wrong.opts = type(wrong.opts)(**{**wrong.opts.__dict__, "token": "wrong\u00e9"})
        with pytest.raises(RuntimeError, match="bad feed request or token"):
            wrong.latestOffset(wrong.initialOffset(), ReadAllAvailable())
        reader = _reader(server)
        with pytest.raises(RuntimeError, match="unknown feed operation"):
            reader.client.call("drop_everything")
        Ingestor(FeedDestination(server.feed, FTConfig(status="off")), range(5)).run()
        start = reader.initialOffset()
        assert [v for _, v in _read(reader, start, reader.latestOffset(start, ReadAllAvailable()))] == list(range(5))
    finally:
        server.stop()


def test_feed_reader_names_a_checkpoint_of_an_ft_on_run() -> None:
    """An FT-off run started on a checkpoint an FT-on run of the topology wrote (stream-id offsets)."""
    server = FeedServer(Feed(2)).start()
    try:
        reader = _reader(server)
        with pytest.raises(ConfigError, match=r"not written by the FT-off feed source.*its own checkpoint location"):
            reader.latestOffset({"ch0": "1795530973337-0", "ch1": "1795530973337-0"}, reader.getDefaultReadLimit())
    finally:
        server.stop()

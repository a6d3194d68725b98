"""The FT source (runtime.spark.ft_source) on real local Spark and the real Redis server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, FrameError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedSerializer
from ftlayer.records.keyhash import key_hash, pmod
from runtime.spark.arrow_codec import arrow_schema, frames_to_record_batch
from runtime.spark.ft_data_sources import FTSource, read_stream
from runtime.spark.ft_source import FTStreamReader, compare_ids, source_schema
from serialization.payload import unpack_payload
from serialization.serializers import make_record

TOPO, SRC, CHANNELS = "topo", "src", 2


@pytest.fixture
def layer(ft_config: FTConfig, redis_client: redis.Redis) -> FTLayer:
    # redis_client is requested for its clean-up of the test's namespace
    return FTLayer(ft_config, TOPO, SRC, num_channels=CHANNELS).open()


def persist(layer: FTLayer, n: int, *, start: int = 0, chunk: int = 50) -> dict[int, int]:
    """Persist n records (values {"i": i}, key f"k{i}") in chunks; returns {sid: i}."""
    out: dict[int, int] = {}
    for lo in range(start, start + n, chunk):
        values = range(lo, min(lo + chunk, start + n))
        recs = [make_record(layer, {"i": i}, key=f"k{i}") for i in values]
        assert layer.persist(recs) == len(recs)
        out.update({r.record_id.source_record_id: i for r, i in zip(recs, values, strict=True)})
    return out


class Collector:
    """A foreachBatch function that keeps (sid, origin, channel, partition id, payload) per batch."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int, int, int, bytes]]] = []
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        rows = df.select("sid", "origin", "channel", F.spark_partition_id().alias("pid"), "payload").collect()
        with self.lock:
            self.batches.append([(r.sid, r.origin, r.channel, r.pid, bytes(r.payload)) for r in rows])

    @property
    def rows(self) -> list[tuple[int, int, int, int, bytes]]:
        with self.lock:
            return [row for batch in self.batches for row in batch]


def start_query(
    spark: Any, ft_config: FTConfig, tmp_path: Path, collector: Collector, **kwargs: Any
) -> Any:
    trigger = kwargs.pop("trigger", {"availableNow": True})
    df = read_stream(spark, ft_config, TOPO, SRC, CHANNELS, **kwargs)
    return (
        df.writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(**trigger)
        .start()
    )


def check_exactly_once(layer: FTLayer, collector: Collector, expected: dict[int, int]) -> None:
    rows = collector.rows
    sids = [r[0] for r in rows]
    assert len(sids) == len(set(sids)), "a record was read twice"
    assert set(sids) == set(expected)
    records = {r[0]: r for r in rows}
    for sid, i in expected.items():
        _, origin, channel, pid, payload = records[sid]
        assert origin == sid
        assert pid == channel, f"record {sid} of channel {channel} arrived in Spark partition {pid}"
        assert unpack_payload(payload) == {"i": i}
        assert channel == pmod(key_hash(f"k{i}"), layer.num_channels)


def channel_lengths(layer: FTLayer) -> list[int]:
    client = layer.store.client
    return [int(client.xlen(layer.store.keys.channel(c))) for c in range(layer.num_channels)]


def reader_for(ft_config: FTConfig, **extra: str) -> FTStreamReader:
    options = {
        "redis_url": ft_config.redis_url, "namespace": ft_config.namespace, "topology": TOPO,
        "source": SRC, "num_channels": str(CHANNELS), **extra,
    }
    reader = FTSource(options).streamReader(source_schema())
    assert isinstance(reader, FTStreamReader)
    return reader


def read_partition(reader: FTStreamReader, partition: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for batch in reader.read(partition):
        assert batch.schema.equals(arrow_schema())
        out.extend(batch.to_pylist())
    return out


# --- through Spark -------------------------------------------------------------------


@pytest.mark.spark
def test_every_record_once_and_partition_is_channel(
    spark: Any, layer: FTLayer, ft_config: FTConfig, tmp_path: Path
) -> None:
    expected = persist(layer, 2000)
    collector = Collector()
    query = start_query(spark, ft_config, tmp_path, collector, read_page_entries=7)
    try:
        assert query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    check_exactly_once(layer, collector, expected)
    assert {r[2] for r in collector.rows} == {0, 1}  # both channels had data
    # commit trimmed every channel stream; nothing was acked, so every record is still pending
    assert channel_lengths(layer) == [0, 0]
    assert layer.pending_count() == len(expected)
    assert layer.stats()["acked"] == 0


@pytest.mark.spark
def test_admission_control_splits_the_backlog_into_capped_batches(
    spark: Any, layer: FTLayer, ft_config: FTConfig, tmp_path: Path
) -> None:
    expected = persist(layer, 1200, chunk=40)  # entries of ~20 record ids per channel
    collector = Collector()
    query = start_query(spark, ft_config, tmp_path, collector, max_records_per_batch=300)
    try:
        assert query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    check_exactly_once(layer, collector, expected)
    sizes = [len(b) for b in collector.batches if b]
    assert len(sizes) >= 4, sizes
    assert max(sizes) <= 300 + 2 * 40, sizes  # the cap, plus at most one entry of slack per channel
    assert channel_lengths(layer) == [0, 0]


@pytest.mark.spark
def test_records_persisted_while_the_query_runs_are_picked_up(
    spark: Any, layer: FTLayer, ft_config: FTConfig, tmp_path: Path
) -> None:
    collector = Collector()
    query = start_query(spark, ft_config, tmp_path, collector, trigger={"processingTime": "200 milliseconds"})
    try:
        expected = persist(layer, 300)
        query.processAllAvailable()
        check_exactly_once(layer, collector, expected)
        expected.update(persist(layer, 500, start=300))
        query.processAllAvailable()
        check_exactly_once(layer, collector, expected)
        # the next trigger (no new data) trims what the last batch read
        deadline = time.monotonic() + 10
        while channel_lengths(layer) != [0, 0] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert channel_lengths(layer) == [0, 0]
        assert query.exception() is None
    finally:
        query.stop()
    assert layer.pending_count() == 800


# --- the reader's methods, called directly ----------------------------------------------


def test_rerun_batch_reads_the_same_records_minus_completed_ones(layer: FTLayer, ft_config: FTConfig) -> None:
    expected = persist(layer, 400, chunk=30)
    reader = reader_for(ft_config, read_page_entries="2")
    start = reader.initialOffset()
    assert start == {"ch0": "0-0", "ch1": "0-0"}
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert set(end) == {"ch0", "ch1"} and all(compare_ids(end[k], "0-0") > 0 for k in end)
    parts = reader.partitions(start, end)
    assert [p.channel for p in parts] == [0, 1]

    first = [read_partition(reader, p) for p in parts]
    again = [read_partition(reader, p) for p in parts]
    assert first == again
    assert sorted(r["sid"] for rows in first for r in rows) == sorted(expected)
    for c, rows in enumerate(first):
        assert {r["channel"] for r in rows} == {c}

    # records appended after `end` are not part of the batch
    persist(layer, 20, start=400)
    assert [read_partition(reader, p) for p in parts] == first

    # complete a few records: a re-run of the batch skips exactly those
    done = {r["sid"]: r["cid"] for r in first[0][:5] + first[1][-3:]}
    assert sorted(layer.ack(done).acked) == sorted(done)
    rerun = [read_partition(reader, p) for p in parts]
    assert [r for rows in first for r in rows if r["sid"] not in done] == [r for rows in rerun for r in rows]

    # a later batch starts after `end` and reads only the new records
    end2 = reader.latestOffset(end, reader.getDefaultReadLimit())
    later = [read_partition(reader, p) for p in reader.partitions(end, end2)]
    assert sum(len(rows) for rows in later) == 20

    reader.commit(end)
    assert sum(channel_lengths(layer)) > 0  # the later entries stay
    reader.commit(end2)
    assert channel_lengths(layer) == [0, 0]
    assert layer.pending_count() == 420 - len(done)
    assert reader.latestOffset(end2, reader.getDefaultReadLimit()) == end2  # trimmed, never backwards


def test_latest_offset_caps_and_respects_read_all_available(layer: FTLayer, ft_config: FTConfig) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    persist(layer, 1000, chunk=20)  # 50 persist calls: about 10 record ids per entry per channel
    reader = reader_for(ft_config, max_records_per_batch="100")
    assert reader.getDefaultReadLimit() == ReadMaxRows(100)
    start = reader.initialOffset()
    everything = reader.latestOffset(start, ReadAllAvailable())
    assert everything == reader.tails() == reader.reportLatestOffset()

    seen: list[int] = []
    offset, batches = start, 0
    while True:
        end = reader.latestOffset(offset, reader.getDefaultReadLimit())
        if end == offset:
            break
        rows = [r for p in reader.partitions(offset, end) for r in read_partition(reader, p)]
        assert 0 < len(rows) <= 100  # records, not entries: a batch may end inside an entry
        seen.extend(r["sid"] for r in rows)
        offset, batches = end, batches + 1
    assert offset == everything
    assert len(seen) == len(set(seen)) == 1000
    assert batches >= 8

    # Trigger.AvailableNow: nothing persisted after prepareForTriggerAvailableNow is read
    reader.prepareForTriggerAvailableNow()
    persist(layer, 10, start=1000)
    assert reader.latestOffset(offset, ReadAllAvailable()) == offset


@pytest.mark.parametrize("one_chunk_per_record", [False, True])
def test_max_records_per_batch_cuts_inside_one_large_persist_call(
    layer: FTLayer, ft_config: FTConfig, one_chunk_per_record: bool,
) -> None:
    """Asked for 50 records a batch, with 200 records persisted in one call (one stream entry per
    channel, of one chunk of ~100 records as ingest files them, or of ~100 one-record chunks):
    every batch reads at most 50, each record once, and a re-run of a batch reads the same ones."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from serialization.payload import pack_payload

    if one_chunk_per_record:
        persist(layer, 200, chunk=200)
    else:
        channels = [pmod(key_hash(f"k{i}"), CHANNELS) for i in range(200)]
        layer.persist_chunks(layer.new_chunks([pack_payload({"i": i}) for i in range(200)],
                                              [key_hash(f"k{i}") for i in range(200)], channels))
    assert channel_lengths(layer) == [1, 1]  # one entry per channel: the old cap read all 200 at once
    reader = reader_for(ft_config, max_records_per_batch="50")
    everything = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    offset, seen, batches = reader.initialOffset(), [], 0
    while True:
        end = reader.latestOffset(offset, reader.getDefaultReadLimit())
        if end == offset:
            break
        parts = reader.partitions(offset, end)
        rows = [r for p in parts for r in read_partition(reader, p)]
        assert 0 < len(rows) <= 50, (offset, end, len(rows))
        assert [r for p in parts for r in read_partition(reader, p)] == rows  # a re-run reads the same
        seen.extend(r["sid"] for r in rows)
        reader.commit(end)
        offset, batches = end, batches + 1
    assert offset == everything
    assert len(seen) == len(set(seen)) == 200 and batches >= 4
    assert channel_lengths(layer) == [0, 0]  # each entry trimmed once read whole
    assert layer.pending_count() == 200


def test_the_unread_rest_of_an_entry_a_batch_ended_inside_is_held_until_the_next_batch_commits(
    layer: FTLayer, ft_config: FTConfig,
) -> None:
    """A batch capped inside a persist call's entry: once it committed (its hold ended), the rest
    of the entry, which no task read, must not time out before the next batch reads it. The
    reader holds it (a carry hold) until the next batch committed; without that, every unread
    record of the entry failed at its timeout and was replayed (checked)."""
    sids = set(persist(layer, 200, chunk=200))  # one call: one entry per channel, one-record chunks
    reader = reader_for(ft_config, max_records_per_batch="50")
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    read = {r["sid"] for p in reader.partitions(start, end) for r in read_partition(reader, p)}
    assert 0 < len(read) <= 50
    reader.commit(end)  # the batch committed and its hold ended
    for _ in range(ft_config.num_buckets):
        layer.on_timeout()
    unread = sids - read
    assert all(layer.pending_of(list(unread))), "an unread record of the cut entry timed out"
    assert layer.stats()["failed_timeout"] <= len(read)  # only what the batch read (and did not ack)
    assert layer.stats()["refiled_held"] > 0
    carries = {h.tag for h in layer.holds()}
    assert len(carries) == 1 and next(iter(carries)).startswith("carry-")
    # the next batch reads the rest under its own hold; once it committed, the first carry ends,
    # also when a new run of the query (a new reader: the first one died) runs that batch
    reader.batch_holds().stop()
    again = reader_for(ft_config, max_records_per_batch="50")
    end2 = again.latestOffset(end, again.getDefaultReadLimit())
    read2 = {r["sid"] for p in again.partitions(end, end2) for r in read_partition(again, p)}
    assert read2 and read2 <= unread
    again.commit(end2)
    assert carries.isdisjoint({h.tag for h in layer.holds()})
    again.batch_holds().stop()


def test_empty_channels_still_get_their_partition(layer: FTLayer, ft_config: FTConfig) -> None:
    recs = [make_record(layer, {"i": i}, channel=1) for i in range(5)]
    layer.persist(recs)
    reader = reader_for(ft_config)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end["ch0"] == "0-0"
    parts = reader.partitions(start, end)
    assert [p.channel for p in parts] == [0, 1]
    assert read_partition(reader, parts[0]) == []
    assert len(read_partition(reader, parts[1])) == 5


def test_reader_pickles_without_its_client(layer: FTLayer, ft_config: FTConfig) -> None:
    import pickle

    persist(layer, 10)
    reader = reader_for(ft_config)
    end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())  # connects
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._layer is None
    parts = copy.partitions(copy.initialOffset(), end)
    assert sum(len(read_partition(copy, p)) for p in parts) == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"redis_url": ""}, "redis_url"),
        ({"num_channels": "zero"}, "num_channels"),
        ({"num_channels": "0"}, "num_channels"),
        ({"topology": "bad name"}, "topology"),
        ({"max_records_per_batch": "-5"}, "max_records_per_batch"),
        ({"redis_url": "http://x"}, "redis_url"),
    ],
)
def test_bad_options_are_refused(ft_config: FTConfig, change: dict[str, str], message: str) -> None:
    options = {
        "redis_url": ft_config.redis_url, "namespace": ft_config.namespace, "topology": TOPO,
        "source": SRC, "num_channels": "2", **change,
    }
    with pytest.raises(ConfigError, match=message):
        FTSource(options).streamReader(source_schema())


def test_channel_count_mismatch_is_refused(layer: FTLayer, ft_config: FTConfig) -> None:
    reader = reader_for(ft_config)
    with pytest.raises(ConfigError, match="channel"):
        reader.latestOffset({"ch0": "0-0"}, reader.getDefaultReadLimit())
    options = {
        "redis_url": ft_config.redis_url, "namespace": ft_config.namespace, "topology": TOPO,
        "source": SRC, "num_channels": "3",
    }
    three = FTSource(options).streamReader(source_schema())
    layer.persist([make_record(layer, 1)])  # in flight: a drained source would take the new count over
    with pytest.raises(Exception, match="2 channels"):
        three.latestOffset(three.initialOffset(), three.getDefaultReadLimit())


# --- the Arrow codec -------------------------------------------------------------------


def test_arrow_schema_is_sparks_own_conversion() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert to_arrow_schema(source_schema(), timezone="UTC").equals(arrow_schema())


def test_codec_matches_the_serializer_and_refuses_corrupt_frames(layer: FTLayer) -> None:
    ser = SemiDeserializedSerializer()
    recs = [make_record(layer, {"i": i, "s": "x" * i}, key=i) for i in range(50)]
    frames = [ser.encode(r) for r in recs]
    rows = frames_to_record_batch(frames).to_pylist()
    for rec, row in zip(recs, rows, strict=True):
        assert row == {
            "sid": rec.record_id.source_record_id, "cid": rec.record_id.current_record_id,
            "key_hash": rec.key_hash, "origin": rec.origin_id, "replay": rec.replay_count,
            "channel": rec.channel, "payload": rec.payload,
        }
    assert frames_to_record_batch([]).num_rows == 0
    corruptions: list[Callable[[bytes], bytes]] = [
        lambda f: f[:-1],  # truncated
        lambda f: f[:-1] + bytes([f[-1] ^ 1]),  # payload bit flip
        lambda f: f[:12] + bytes([f[12] ^ 0x80]) + f[13:],  # sid bit flip
        lambda f: f[:4] + b"\x02" + f[5:],  # version
        lambda f: f[:20],  # shorter than a header
    ]
    for corrupt in corruptions:
        bad = [*frames[:3], corrupt(frames[3]), *frames[4:]]
        with pytest.raises(FrameError, match="frame 3"):
            frames_to_record_batch(bad)


@pytest.mark.parametrize("pad", [0, 20, 35, 45, 1000])  # payloads below, around and far above 64 bytes
def test_codec_finds_a_flipped_payload_bit_in_any_frame_whatever_its_length(layer: FTLayer, pad: int) -> None:
    ser = SemiDeserializedSerializer()
    recs = [make_record(layer, {"i": i, "s": "z" * (pad + i % 7)}, key=i) for i in range(40)]
    frames = [ser.encode(r) for r in recs]
    assert frames_to_record_batch(frames).num_rows == 40
    for bad_at in (0, 17, 39):
        for byte in (48, len(frames[bad_at]) - 1):  # the first and the last payload byte
            bad = list(frames)
            bad[bad_at] = bad[bad_at][:byte] + bytes([bad[bad_at][byte] ^ 0x10]) + bad[bad_at][byte + 1 :]
            with pytest.raises(FrameError, match=f"frame {bad_at}"):
                frames_to_record_batch(bad)


def test_codec_reads_frames_behind_a_prefix(layer: FTLayer) -> None:
    ser = SemiDeserializedSerializer()
    recs = [make_record(layer, {"i": i, "s": "y" * (i % 5)}, key=i) for i in range(20)]
    frames = [ser.encode(r) for r in recs]
    plain = frames_to_record_batch(frames)
    assert frames_to_record_batch([b"ABCDEFGHIJKL" + f for f in frames], prefix=12).equals(plain)
    bad = [b"ABCDEFGHIJKL" + f for f in frames]
    bad[7] = bad[7][:-1] + bytes([bad[7][-1] ^ 1])
    with pytest.raises(FrameError, match="frame 7"):
        frames_to_record_batch(bad, prefix=12)


def test_an_ft_off_checkpoint_is_refused_with_the_reason(layer: FTLayer, ft_config: FTConfig) -> None:
    """A checkpoint written by an FT-off run of the same topology (feed offsets) is named as such."""
    reader = reader_for(ft_config)
    with pytest.raises(ConfigError, match=r"written by an FT-off run.*its own checkpoint location"):
        reader.latestOffset({"feed": "f1", "ch0": 10, "ch1": 12}, reader.getDefaultReadLimit())

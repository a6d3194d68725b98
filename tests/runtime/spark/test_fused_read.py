"""The first stage run inside the source's read task: same results, one mapInArrow hop less."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.graph import Op
from runtime.sinks import JsonLinesSink
from runtime.spark.fused_read import FusedStage, decode, fused_from
from runtime.spark.row_batch import ROW_COLUMNS
from runtime.spark.stages import Stage, TaskEnv
from runtime.topology import Topology
from serialization.payload import pack_payload, unpack_payload
from tests.runtime.test_topology_e2e import clicks


def _double(e: dict[str, Any]) -> dict[str, Any]:
    return {**e, "n": e["i"] * 2}


def _source_batch(n: int) -> pa.RecordBatch:
    ids = list(range(1, n + 1))
    return pa.RecordBatch.from_arrays(
        [pa.array(ids, pa.int64()), pa.array(ids, pa.int64()), pa.array([0] * n, pa.int64()),
         pa.array(ids, pa.int64()), pa.array([0] * n, pa.int32()), pa.array([0] * n, pa.int32()),
         pa.array([pack_payload({"i": i}) for i in ids], pa.binary())],
        names=["sid", "cid", "key_hash", "origin", "replay", "channel", "payload"])


def test_encoded_stage_round_trips_and_runs_on_source_batches() -> None:
    env = TaskEnv(FTConfig(status="off"), "t", ("s",), 2)
    fused = FusedStage(3, Stage(env, 7, (Op("map", _double, 1),)))
    text = fused.encode()
    assert fused_from({"FUSED_STAGE": text}) == text and fused_from({"x": "1"}) is None
    again = decode(text)
    assert again.src == 3 and again.stage.stage_id == 7
    (out,) = list(again.run([_source_batch(5)]))
    assert out.schema.names == list(ROW_COLUMNS)
    assert out.column("src").to_pylist() == [3] * 5
    assert [unpack_payload(p)["n"] for p in out.column("payload").to_pylist()] == [2, 4, 6, 8, 10]


def test_a_bad_option_is_refused() -> None:
    with pytest.raises(ConfigError, match="fused_stage"):
        decode("not base64 at all!")
    with pytest.raises(ConfigError, match="not a fused stage"):
        decode(base64.b64encode(pickle.dumps({"a": 1})).decode())


def _plan(query: Any, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    query.query.explain()
    return capsys.readouterr().out


@pytest.mark.spark
@pytest.mark.parametrize("status", ["on", "off"])
def test_fused_and_separate_stages_give_the_same_run(spark: Any, ft_config: FTConfig, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str], status: str) -> None:
    """source -> map -> key_by -> map -> sink: with fusion the plan has one MapInArrow less (the
    first stage runs in the source's read task), and every record is delivered once and acked,
    with no timeout or replay, exactly as with the stage on its own."""
    n = 1200
    plans: dict[bool, str] = {}
    for fuse in (True, False):
        cfg = ft_config.replace(status=status, timeout_s=30.0, fuse_source_stage=fuse,
                                namespace=f"{ft_config.namespace}{int(fuse)}")
        out = JsonLinesSink(tmp_path / f"out{int(fuse)}")
        topo = Topology("fused", cfg)
        (topo.source("clicks", clicks(n), key=lambda e: e["user"]).map(_double).key_by(lambda e: e["user"])
         .map(lambda e: {**e, "seen": True}).sink(out))
        query = topo.start(spark, checkpoint_location=str(tmp_path / f"ckpt{int(fuse)}"), trigger_interval_s=0.2)
        try:
            assert query.await_drained(180), query.stats()
            query.query.processAllAvailable()
            plans[fuse] = _plan(query, capsys)
        finally:
            query.stop()
        lines = out.read_all()
        assert sorted(line["value"]["n"] for line in lines) == [2 * i for i in range(n)]
        if status == "on":
            stats = query.layers[0].stats()
            assert stats["acked"] == n and stats["failed_timeout"] == 0 and stats["replayed"] == 0
            assert query.layers[0].leftovers() == []
    # fused: the scan itself yields the stage's rows (src, ..., delta), and the plan holds one
    # MapInArrow (the sink stage) where the separate stages hold two
    assert "MicroBatchScan[src#" in plans[True] and "MicroBatchScan[sid#" in plans[False], plans
    assert plans[False].count("MapInArrow") == 2 * plans[True].count("MapInArrow") > 0, plans


def test_the_compiler_wraps_a_feed_reader_with_its_stage() -> None:
    """format ftlayer_fused over a real feed server: offsets, partitions and commits are the feed
    reader's, call for call; read() yields the stage's rows (STAGE_ROW) for the feed's rows."""
    from runtime.driver.feed import Feed, FeedDestination, FeedServer
    from runtime.driver.ingest import Ingestor
    from runtime.spark.feed_source import FORMAT as FEED_FORMAT
    from runtime.spark.feed_source import FeedStreamReader, feed_options
    from runtime.spark.fused_read import FUSED_OPTION, INNER_OPTION, FusedReader, FusedSource
    from runtime.spark.row_contract import STAGE_ROW

    cfg = FTConfig(status="off", flush_batch_size=50)
    server = FeedServer(Feed(2)).start()
    try:
        Ingestor(FeedDestination(server.feed, cfg), ({"i": i} for i in range(100))).run()
        env = TaskEnv(cfg, "t", ("s",), 2)
        fused = FusedStage(4, Stage(env, 9, (Op("map", _double, 1),)))
        options = {**feed_options(server), INNER_OPTION: FEED_FORMAT, FUSED_OPTION: fused.encode()}
        source = FusedSource(options)
        assert STAGE_ROW.same_struct(source.schema())
        reader = source.streamReader(source.schema())
        assert isinstance(reader, FusedReader) and isinstance(reader.inner, FeedStreamReader)
        reader = pickle.loads(pickle.dumps(reader))  # as shipped to a read task
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        assert start == reader.inner.initialOffset() and end == reader.inner.reportLatestOffset()
        parts = reader.partitions(start, end)
        assert [p.channel for p in parts] == [0, 1]
        out = [b for p in parts for b in reader.read(p)]
        assert all(b.schema.equals(STAGE_ROW.arrow_schema()) for b in out)
        rows = [r for b in out for r in b.to_pylist()]
        assert {r["src"] for r in rows} == {4}
        assert sorted(unpack_payload(r["payload"])["n"] for r in rows) == [2 * i for i in range(100)]
        reader.commit(end)
        assert server.feed.stats()["committed"] == 100
        with pytest.raises(ConfigError, match="row schema"):
            source.streamReader(STAGE_ROW.struct_type().add("x", "integer"))
        with pytest.raises(ConfigError, match=INNER_OPTION):
            FusedSource({**options, INNER_OPTION: "parquet"}).streamReader(source.schema())
    finally:
        server.stop()

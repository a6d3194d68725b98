"""The typed read's columnar path (runtime.spark.stored_columns) against a real server, no Spark job:
a source ingested with a schema is read from its chunks' columns sections when the query reads with
the same schema, from the payloads otherwise, and settled records are left out either way.

To show which path a read took, some tests file chunks whose sections hold other values than their
payloads (values + 1000): no real writer does that, but only the columnar path can return them."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import key_hash, pmod
from runtime.dataframe.sources import with_metadata
from runtime.driver.ingest import Ingestor
from runtime.spark.ft_data_sources import FTDataSource
from runtime.spark.schema_check import SchemaCheck
from runtime.spark.typed_source import TypedStreamReader
from serialization.payload import pack_payload

TOPO, SRC, CHANNELS = "topo", "cols", 2
SCHEMA = "i long, name string"


@pytest.fixture
def layer(ft_config: FTConfig, redis_client: redis.Redis) -> FTLayer:
    # redis_client is requested for its clean-up of the test's namespace
    return FTLayer(ft_config, TOPO, SRC, num_channels=CHANNELS).open()


def _values(n: int, shift: int = 0) -> list[dict[str, Any]]:
    return [{"i": i + shift, "name": f"n{i + shift}"} for i in range(n)]


def file_chunks(layer: FTLayer, values: list[dict[str, Any]], sections: list[dict[str, Any]] | None,
                ddl: str = SCHEMA) -> None:
    """``values`` filed as ingest files them, with ``sections`` (the same count) as their columns,
    written with the schema ``ddl``."""
    payloads = [pack_payload(v) for v in values]
    hashes = [key_hash(v["name"]) for v in values]
    columns = None
    if sections is not None:
        bad, columns = SchemaCheck(parse(ddl)).with_columns([pack_payload(v) for v in sections])
        assert not bad
    chunks = layer.new_chunks(payloads, hashes, [pmod(h, CHANNELS) for h in hashes], columns=columns)
    assert layer.persist_chunks(chunks) == len(values)


def parse(ddl: str) -> Any:
    from runtime.spark.ddl import parse_schema

    return parse_schema(ddl)


def _reader(ft_config: FTConfig, schema: str, **extra: str) -> TypedStreamReader:
    options = {"redis_url": ft_config.redis_url, "namespace": ft_config.namespace, "topology": TOPO,
               "source": SRC, "num_channels": str(CHANNELS), **extra}
    reader = FTDataSource(options).streamReader(with_metadata(schema))
    assert isinstance(reader, TypedStreamReader)
    return reader


def read_rows(ft_config: FTConfig, schema: str = SCHEMA) -> list[dict[str, Any]]:
    reader = _reader(ft_config, schema)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    rows = [r for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()]
    return sorted(rows, key=lambda r: r["i"])


def test_the_same_schema_reads_the_stored_columns(layer: FTLayer, ft_config: FTConfig) -> None:
    file_chunks(layer, _values(300), _values(300, shift=1000))
    rows = read_rows(ft_config)
    assert [(r["i"], r["name"]) for r in rows] == [(v["i"], v["name"]) for v in _values(300, shift=1000)]
    assert all(r["_ftlayer"]["source"] == f"{TOPO}/{SRC}" for r in rows)


def test_another_schema_decodes_the_payloads(layer: FTLayer, ft_config: FTConfig) -> None:
    file_chunks(layer, _values(50), _values(50, shift=1000))
    # another column order is another Arrow schema: the payloads are decoded, not the sections
    rows = read_rows(ft_config, "name string, i long")
    assert [(r["i"], r["name"]) for r in rows] == [(v["i"], v["name"]) for v in _values(50)]
    # a type whose buffers the section's would fit (int64 as timestamp): still the payloads' values
    stamps = read_rows(ft_config, "i timestamp, name string")
    assert [r["i"].timestamp() for r in sorted(stamps, key=lambda r: r["name"])] == sorted(
        [float(v["i"]) for v in _values(50)], key=lambda f: f"n{int(f)}")


def test_a_comment_is_part_of_the_schema_whatever_a_worker_read_before(layer: FTLayer, ft_config: FTConfig) -> None:
    """A COMMENT becomes Arrow field metadata, which the fingerprint covers and pyarrow's Schema equality
    ignores: each read takes the sections written with its own schema only, in any order in one process."""
    commented = "i long COMMENT 'the id', name string"
    file_chunks(layer, _values(40), _values(40, shift=1000))
    assert [r["i"] for r in read_rows(ft_config)] == [v["i"] for v in _values(40, shift=1000)]
    assert [r["i"] for r in read_rows(ft_config, commented)] == [v["i"] for v in _values(40)]  # the payloads


def test_a_commented_schema_reads_its_own_sections_after_a_plain_read(layer: FTLayer, ft_config: FTConfig) -> None:
    commented = "i long COMMENT 'the id', name string"
    file_chunks(layer, _values(40), _values(40, shift=1000), ddl=commented)
    assert [r["i"] for r in read_rows(ft_config)] == [v["i"] for v in _values(40)]  # the payloads
    assert [r["i"] for r in read_rows(ft_config, commented)] == [v["i"] for v in _values(40, shift=1000)]


def test_chunks_without_columns_read_from_their_payloads(layer: FTLayer, ft_config: FTConfig) -> None:
    file_chunks(layer, _values(40), None)
    assert [r["i"] for r in read_rows(ft_config)] == list(range(40))


def test_a_page_with_one_chunk_without_columns_is_decoded_whole(layer: FTLayer, ft_config: FTConfig) -> None:
    file_chunks(layer, _values(40), _values(40, shift=1000))
    file_chunks(layer, _values(40, shift=40), None)  # the next entry, on the same channels
    got = [r["i"] for r in read_rows(ft_config)]
    assert sorted(got) == list(range(80))  # every value from its payload: no section was used


def test_settled_records_are_left_out_of_the_stored_columns(layer: FTLayer, ft_config: FTConfig) -> None:
    file_chunks(layer, _values(200), _values(200, shift=1000))
    by_i = {r["i"] - 1000: r["_ftlayer"]["sid"] for r in read_rows(ft_config)}
    failed = [by_i[i] for i in range(0, 200, 3)]
    assert layer.fail(failed, "test") == len(failed)
    got = [r["i"] for r in read_rows(ft_config)]
    assert got == [1000 + i for i in range(200) if i % 3]
    assert {r["_ftlayer"]["sid"] for r in read_rows(ft_config)} == {by_i[i] for i in range(200) if i % 3}


def test_ingest_with_a_schema_files_columns_that_read_back(layer: FTLayer, ft_config: FTConfig) -> None:
    # one misfit sorts the batch out record by record: the columns must still line up with the frames
    values: list[Any] = [*_values(120), {"i": "not a number", "name": "x"}, *_values(80, shift=120)]
    ingestor = Ingestor(layer, iter(values), key=lambda v: v["name"],
                        check=SchemaCheck(parse(SCHEMA)))
    ingestor.run()
    assert ingestor.ingested == 200
    pages = [layer.read_channel(c).spans() for c in range(CHANNELS)]
    assert all(p.columns is not None for p in pages if len(p.sids))
    rows = read_rows(ft_config)
    assert [(r["i"], r["name"]) for r in rows] == [(v["i"], v["name"]) for v in _values(200)]


def test_batches_cut_inside_chunks_read_each_stored_row_once(layer: FTLayer, ft_config: FTConfig) -> None:
    # 37 records a batch: the batches' bounds fall inside chunks (positions within an entry)
    file_chunks(layer, _values(300), _values(300, shift=1000))
    reader = _reader(ft_config, SCHEMA, max_records_per_batch="37")
    start, got, batches = reader.initialOffset(), [], 0
    while True:
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if end == start:
            break
        got += [r["i"] for p in reader.partitions(start, end) for b in reader.read(p) for r in b.to_pylist()]
        start, batches = end, batches + 1
    assert batches >= 300 // 37
    assert sorted(got) == [1000 + i for i in range(300)]


def test_the_api_keeps_columns_unless_told_not_to(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    import time

    from ftlayer.errors import ConfigError
    from runtime.dataframe import sources

    for keep in (True, False):
        handle = sources.source(TOPO, f"keep{int(keep)}", config=ft_config, num_channels=CHANNELS)
        try:
            ingestor = handle.ingest(_values(60), schema=SCHEMA, keep_columns=keep)
            deadline = time.monotonic() + 60
            while not ingestor.done and time.monotonic() < deadline:
                time.sleep(0.02)
            assert ingestor.ingested == 60
            pages = [p for p in (handle.layer.read_channel(c).spans() for c in range(CHANNELS)) if len(p.sids)]
            assert pages and all((p.columns is not None) is keep for p in pages)
            if not keep:
                with pytest.raises(ConfigError, match="keep_columns=False says what to keep"):
                    handle.ingest([], keep_columns=False)
        finally:
            handle.stop()

"""A reference for the DataFrame bench: the bench's rows from a trivial Python streaming data source.

``python-source`` is plain Structured Streaming (no ftlayer: no Redis, no persist, no acks) whose
source is a PySpark Python data source (``pyspark.sql.datasource``) like ftlayer's: each batch's
rows are computed in the read task by Arrow kernels (no Python step per row), in batches of
``ROWS_PER_BATCH`` over 2 partitions, like ``plain``'s ``rate-micro-batch``. Whatever separates it
from ``plain`` is what any Python source costs in PySpark (a Python read task per partition and
batch, the rows handed from Python to the JVM in Arrow); whatever separates ``ft-on`` from it is
ftlayer's own. Registered by :func:`register` under :data:`NAME`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

NAME = "ftlayer_bench_rows"
ROWS_PER_BATCH = 50_000  # as plain's rate-micro-batch
USERS = 97  # runtime.bench.e2e.USERS: the same user and page columns as make_value


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end


class _RowsReader(DataSourceStreamReader):
    """Offsets count rows; every ``latestOffset`` makes ``ROWS_PER_BATCH`` more available, up to ``total``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.available = 0

    def initialOffset(self) -> dict[str, int]:
        return {"rows": 0}

    def latestOffset(self, start: Any = None, limit: Any = None) -> dict[str, int]:
        """Both signatures of pyspark's (with and without the read-limit API); the limit is not used."""
        self.available = min(self.total, self.available + ROWS_PER_BATCH)
        return {"rows": self.available}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[_Range]:
        a, b = int(start["rows"]), int(end["rows"])
        mid = (a + b) // 2
        return [_Range(a, mid), _Range(mid, b)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        assert isinstance(partition, _Range)
        i = pa.array(np.arange(partition.start, partition.end, dtype=np.int64))
        user = pc.binary_join_element_wise("user-", pc.cast(pc.remainder(i, USERS), pa.string()), "")
        page = pc.binary_join_element_wise("/p/", pc.cast(pc.remainder(i, 13), pa.string()), "")
        yield pa.RecordBatch.from_arrays([i, user, page], names=["i", "user", "page"])

    def commit(self, end: dict[str, int]) -> None:
        return None


class BenchRows(DataSource):
    """``spark.readStream.format(NAME).option("records", N)``: rows ``i, user, page`` for i in [0, N)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return "i long, user string, page string"

    def streamReader(self, schema: Any) -> _RowsReader:
        return _RowsReader(int(self.options.get("records", "0")))


def register(spark: Any) -> None:
    spark.dataSource.register(BenchRows)

"""The rows an effectively-once sink writes: the user's columns plus the lineage id as the key.

Shared by every DataFrame-path sink of ``runtime.idempotent``: each writes what
:func:`keyed_rows` selects, so each treats the ``_ftlayer`` column and a clash of names the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ftlayer.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DEFAULT_KEY", "DEFAULT_LINEAGE", "keyed_rows"]

DEFAULT_KEY = "lineage_id"
# runtime.spark.payload_columns.METADATA_COLUMN's lineage field; spelled out so that importing a
# sink does not import pyspark (a Topology sink is built on the driver before Spark is needed)
DEFAULT_LINEAGE = "_ftlayer.lineage"


def keyed_rows(df: DataFrame, sink: str, *, key: str = DEFAULT_KEY, lineage: str = DEFAULT_LINEAGE,
               columns: Sequence[str] | None = None) -> DataFrame:
    """``df`` as ``key`` (the lineage id, from the column path ``lineage``) and the user's columns
    (``columns``, else every column but ``_ftlayer`` and the lineage column's top level).

    Raises ``ConfigError`` naming ``sink`` if the lineage column is missing (a DataFrame that
    did not come from ``ftlayer.read_stream``, or one whose ``_ftlayer`` was dropped) or a user
    column is already called ``key``.
    """
    from pyspark.sql import functions as F

    from runtime.spark.payload_columns import METADATA_COLUMN

    top = lineage.split(".", maxsplit=1)[0]
    if top not in df.columns:
        msg = (f"{sink}: the DataFrame has no {top!r} column, so no lineage id to key rows by; keep "
               f"{METADATA_COLUMN!r} (ftlayer.read_stream adds it) in the plan, or pass lineage= a column of yours")
        raise ConfigError(msg)
    names = list(columns) if columns is not None else [c for c in df.columns if c not in (METADATA_COLUMN, top)]
    if key in names:
        msg = f"{sink}: the DataFrame already has a column {key!r}, the key the lineage id is written to; pass key="
        raise ConfigError(msg)
    return df.select(F.col(lineage).alias(key), *[F.col(f"`{c}`") for c in names])

"""Admission control of PySpark's Python streaming sources, detected at run time.

pyspark 4.0 has Python streaming data sources (``DataSourceStreamReader``) but no admission
control: its source runner calls ``latestOffset()`` with no arguments and never asks for a
read limit. Newer pyspark ships ``pyspark.sql.streaming.datasource`` (``ReadLimit``,
``ReadMaxRows``, ``ReadAllAvailable``, ``SupportsTriggerAvailableNow``); its runner inspects
the signature of ``latestOffset`` and, when it takes parameters, calls
``latestOffset(start, limit)`` and ``getDefaultReadLimit()``.

So ftlayer's readers define ``latestOffset(start=None, limit=None)`` and import the limit
classes only where they are used, through this module:

- :data:`HAS_ADMISSION_CONTROL`: whether this pyspark has them.
- :data:`AvailableNowBase`: ``SupportsTriggerAvailableNow``, or a plain mixin without it
  (``Trigger.AvailableNow`` then does not reach the source).
- :func:`read_all`, :func:`read_max_rows`: the limit objects (only called where the runner
  asks for a limit, i.e. where the classes exist).
- :func:`max_rows`: the row cap of a limit, or None (duck-typed, no import).

Without admission control, ``max_records_per_batch`` is not honoured (every batch reads
all that is available) and the ``latestOffset`` trim of the previous batch's entries is
left to ``commit``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HAS_ADMISSION_CONTROL", "AvailableNowBase", "max_rows", "read_all", "read_max_rows"]

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow as _AvailableNow

    HAS_ADMISSION_CONTROL = True
except ImportError:  # pyspark < 4.1: no admission control for Python sources
    HAS_ADMISSION_CONTROL = False

    class _AvailableNow:  # type: ignore[no-redef]
        """Stand-in mixin: this pyspark cannot tell a source about Trigger.AvailableNow."""

AvailableNowBase: type = _AvailableNow


def read_all() -> Any:
    """``ReadAllAvailable()`` (needs admission control)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    return ReadAllAvailable()


def read_max_rows(n: int) -> Any:
    """``ReadMaxRows(n)`` (needs admission control)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    return ReadMaxRows(n)


def max_rows(limit: Any) -> int | None:
    """The row cap of a ``ReadMaxRows`` limit; None for any other limit or none at all."""
    if limit is None or type(limit).__name__ != "ReadMaxRows":
        return None
    return int(limit.max_rows)

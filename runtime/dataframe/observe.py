"""The progress log listener of the DataFrame path: one per SparkSession, over every source it reads.

A topology attaches an :class:`~runtime.driver.listener.FTProgressListener` limited to its own
query (``runtime.driver.observe``). A DataFrame query is the user's, so the DataFrame path
attaches one listener per session for every query (``query_name=None``) and adds each source
that :func:`ftlayer.read_stream` opens: each micro-batch's progress is logged on
``ftlayer.progress`` with the FT figures of those sources, as for a topology.
"""

from __future__ import annotations

import threading
from typing import Any

from runtime.driver.listener import FTProgressListener, attach

__all__ = ["progress_listener"]

_ATTR = "_ftlayer_progress_listener"
_lock = threading.Lock()


def progress_listener(spark: Any) -> FTProgressListener:
    """The session's DataFrame-path progress listener (attached on first use, for every query)."""
    with _lock:
        listener: FTProgressListener | None = getattr(spark, _ATTR, None)
        if listener is None:
            listener = attach(spark, [], query_name=None)
            setattr(spark, _ATTR, listener)
        return listener

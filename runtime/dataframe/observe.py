"""The progress log listener of the DataFrame path: one per SparkSession, over every source it reads.

A topology attaches an :class:`~runtime.driver.listener.FTProgressListener` limited to its own
query (``runtime.driver.observe``). A DataFrame query is the user's, so the DataFrame path
attaches one listener per session for every query that reads an FT source (``accept``:
:func:`reads_ftlayer`, from the event alone) and adds each source
that :func:`ftlayer.read_stream` opens: each micro-batch's progress is logged on
``ftlayer.progress`` with the FT figures of those sources, as for a topology.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from runtime.driver.listener import FTProgressListener, attach

__all__ = ["detach_if_idle", "progress_listener", "reads_ftlayer"]

_FT_OFFSET_KEY = re.compile(r"^ch\d+(s\d+)?$")


def reads_ftlayer(progress: Any) -> bool:
    """True if a progress report's query reads an FT source (its offsets name channel streams),
    decided from the report alone: other queries of the session cost Redis nothing."""
    for source in getattr(progress, "sources", None) or ():
        raw = getattr(source, "endOffset", None)
        try:
            offset = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue
        if isinstance(offset, dict) and offset and all(_FT_OFFSET_KEY.match(str(k)) for k in offset):
            return True
    return False

_ATTR = "_ftlayer_progress_listener"
_lock = threading.Lock()


def progress_listener(spark: Any) -> FTProgressListener:
    """The session's DataFrame-path progress listener (attached on first use, for every query)."""
    with _lock:
        listener: FTProgressListener | None = getattr(spark, _ATTR, None)
        if listener is None:
            listener = attach(spark, [], query_name=None, accept=reads_ftlayer)
            setattr(spark, _ATTR, listener)
        return listener


def detach_if_idle(spark: Any) -> None:
    """Unregister the session's progress listener once it reports on no source."""
    from runtime.driver.listener import detach

    with _lock:
        listener: FTProgressListener | None = getattr(spark, _ATTR, None)
        if listener is None or listener.stores:
            return
        setattr(spark, _ATTR, None)
    detach(spark, listener)

"""The typed read's columnar path: a page's user columns taken from its chunks' columns sections.

A source ingested with a schema keeps each chunk's records as Arrow columns after its frames
(``ftlayer.records.chunk_columns``). When the query reads with that same schema, the page's
columns are those sections, cut to the records still pending, instead of one msgpack unpack per
payload (:func:`runtime.spark.payload_columns.decode_batch`'s other paths).

Contract of :func:`stored_columns`: it returns the user columns exactly as the bulk decode of the
page's payloads would (the section was made by that decode at ingest, with the same schema, which
its fingerprint names), or None, and the caller decodes the payloads. None when any chunk of the
page has no section, one written with another schema (another column, type, nullability or field
metadata such as a ``COMMENT``, or a ``spark.sql.timestampType`` that makes another Arrow type), one
that does not parse or holds a row count other than its chunk's. No Python step per record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ftlayer.records.chunk_columns import read_columns, schema_fingerprint

__all__ = ["stored_columns"]


def stored_columns(sections: Sequence[tuple[bytes, Any, Any, int]] | None, schema: Any) -> list[Any] | None:
    """The columns of ``schema`` (a ``pyarrow.Schema`` of the user fields) for a page whose chunks'
    sections are ``sections`` (``PendingSpans.columns``: per chunk ``(fingerprint, body, rows, n)``,
    in read order), or None (module contract)."""
    import numpy as np
    import pyarrow as pa

    if not sections:
        return None
    # not cached by schema: pyarrow's Schema equality ignores field metadata (Spark's COMMENT and
    # char/varchar), which the fingerprint covers, so a cache would give one schema the other's
    want = schema_fingerprint(schema)
    parts = []
    for fingerprint, body, rows, n in sections:
        if fingerprint != want:
            return None
        batch = read_columns(body, schema, n)
        if batch is None:
            return None
        whole = len(rows) == n and (n == 0 or (int(rows[0]) == 0 and int(rows[-1]) == n - 1))
        parts.append(batch if whole else batch.take(pa.array(np.asarray(rows, dtype=np.int64))))
    page = parts[0] if len(parts) == 1 else pa.concat_batches(parts)
    return list(page.columns)

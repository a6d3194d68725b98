"""A namespace's owner record: the JSON ftlayer writes once when the first source registers.

It tells ftlayer's tools that ftlayer created the namespace (``ftlayer dlq`` refuses to change a
namespace it did not create unless forced). Contract: :func:`new_owner_record` is the value to
write (with SETNX, so the first one stays); :func:`owner_record` reads it back, None for a
missing key, a value that is no JSON object, or one another writer left.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from ftlayer.keyspace.keys import owner_key

__all__ = ["OWNER_TAG", "new_owner_record", "owner_record"]

OWNER_TAG = "ftlayer"  # the "by" of an owner record that ftlayer wrote


def new_owner_record(now_ms: int) -> str:
    """The owner record to write for a namespace created at ``now_ms``."""
    return json.dumps({"created_ms": now_ms, "by": OWNER_TAG})


def owner_record(client: redis.Redis, namespace: str) -> dict[str, Any] | None:
    """The namespace's owner record if ftlayer wrote it (``by == "ftlayer"``), else None.

    None means the key is missing, is not a JSON object, or names another
    writer: the namespace was not created by ftlayer (or predates owner records).
    """
    raw = client.get(owner_key(namespace))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("by") != OWNER_TAG:
        return None
    return data

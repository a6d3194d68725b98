"""ftlayer: record-level at-least-once processing for PySpark Structured Streaming.

The core package holds ids and key hashing, config, the Redis-backed acker,
persistence, timeouts and replay. ``serialization``, ``partitioners`` and
``runtime`` are sibling packages of the same distribution.
"""

from ftlayer.errors import FailRecord, FTLayerError
from ftlayer.ids import RecordId

__all__ = ["FTLayerError", "FailRecord", "RecordId"]
__version__ = "0.1.0"

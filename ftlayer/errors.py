"""The exception hierarchy: one root, :class:`FTLayerError`, and specific subclasses.

Every message names the record, partition, option or URL involved. Code in this
project builds messages as ``msg = f"..."; raise X(msg) from exc`` so that the
original cause stays attached.

:class:`FailRecord` is *not* an error of the layer: user functions raise it to
fail the record they were called with (explicit failing, as in the original
design's FailException).
"""

from __future__ import annotations

__all__ = [
    "AckerError",
    "ChannelCountMismatchError",
    "ConfigError",
    "DurabilityError",
    "EmbeddedServerError",
    "FTLayerError",
    "FailRecord",
    "FrameError",
    "KeyHashError",
    "LeaseLostError",
    "PartitioningError",
    "RedisUnavailableError",
    "SerializationError",
    "StateDirBusyError",
    "TopologyError",
    "UnsupportedTypeError",
]


class FTLayerError(Exception):
    """Root of every error raised by ftlayer."""


class ConfigError(FTLayerError, ValueError):
    """A configuration option has a bad value; the message names option, value and what is allowed."""


class RedisUnavailableError(FTLayerError, ConnectionError):
    """The Redis server could not be reached. The message names the URL with its password masked."""


class EmbeddedServerError(FTLayerError, RuntimeError):
    """The embedded valkey-server could not be found, started or stopped."""


class StateDirBusyError(FTLayerError):
    """Another live process runs a topology on this state directory (it holds the directory's lock)."""


class DurabilityError(FTLayerError):
    """Redis did not confirm the durability that the configured mode promises (e.g. WAITAOF timed out)."""


class SerializationError(FTLayerError, ValueError):
    """Bytes could not be turned into a record, or a value into bytes."""


class FrameError(SerializationError):
    """A frame is truncated, has a wrong length or checksum, or an unknown version."""


class UnsupportedTypeError(SerializationError, TypeError):
    """A payload holds a value of a type that the msgpack payload codec does not carry."""


class KeyHashError(FTLayerError, TypeError):
    """A key selector returned a value that cannot be hashed the way Spark SQL hashes it."""


class AckerError(FTLayerError):
    """A flush, persist or replay call against the acker state failed or got a malformed reply."""


class LeaseLostError(FTLayerError):
    """This process no longer holds the rotator lease; another driver rotates now."""


class PartitioningError(FTLayerError):
    """A partitioner was asked for something its strategy cannot do, or a topology mixes strategies unsupported."""


class ChannelCountMismatchError(PartitioningError):
    """The persisted data was written with a different number of channels than this run uses."""


class TopologyError(FTLayerError):
    """A topology is malformed (for example, an operator after a sink)."""


class FailRecord(Exception):
    """Raise inside a user function to fail the record it was called with.

    The record's whole tree fails at once and is handed to the replayer, which
    replays it under a new source record id (or dead-letters it after
    ``max_replays``). ``reason`` is stored with the failure and shown in the
    dead-letter queue.
    """

    def __init__(self, reason: str = "FailRecord raised") -> None:
        super().__init__(reason)
        self.reason = reason

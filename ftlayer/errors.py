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
    "ChunkIdInUseError",
    "ConfigError",
    "ConnectServerError",
    "DurabilityError",
    "EmbeddedServerError",
    "FTLayerError",
    "FailRecord",
    "FrameError",
    "KeyHashError",
    "LeaseLostError",
    "PartitioningError",
    "RecordFailError",
    "RedisUnavailableError",
    "ScriptCallError",
    "SerializationError",
    "SinkWriteError",
    "SparkConnectUnsupportedError",
    "StateDirBusyError",
    "TopologyError",
    "UnsupportedTypeError",
]


class FTLayerError(Exception):
    """Root of every error raised by ftlayer."""


class ConfigError(FTLayerError, ValueError):
    """A configuration option has a bad value; the message names option, value and what is allowed.

    ``option`` is the option's name when the error is about one option (None otherwise).
    """

    option: str | None = None


class RedisUnavailableError(FTLayerError, ConnectionError):
    """The Redis server could not be reached. The message names the URL with its password masked."""


class EmbeddedServerError(FTLayerError, RuntimeError):
    """The embedded valkey-server could not be found, started or stopped."""


class StateDirBusyError(FTLayerError):
    """Another live process runs a topology on this state directory (it holds the directory's lock)."""


class DurabilityError(FTLayerError):
    """Redis did not confirm the durability that the configured mode promises.

    Raised at open when ``durability = "waitaof"`` meets a server without AOF
    (``appendonly no``) or with ``appendfsync no``, and by a persist, replay or
    requeue whose WAITAOF timed out: the write reached the server but its fsync
    was not confirmed within ``waitaof_timeout_ms``. Ingest stops on it (it is
    not retried); the message names the option.
    """


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


class ScriptCallError(FTLayerError, TypeError):
    """A server-side script was called with KEYS or ARGV other than those it declares (a bug in the
    caller, raised before anything is sent). The message names the script and the key or argument."""


class ChunkIdInUseError(AckerError):
    """A persist named a chunk id that a pending chunk of the source already uses.

    ftlayer's own writers draw new ids and persist again; a caller that chose the ids itself gets
    this error. ``chunk`` is the chunk's 6-byte field name (``ftlayer.records.chunks``).

    A persist is split into calls (per shard, and per ``flush_batch_size`` records), each atomic:
    a refused call wrote nothing, the others were applied. ``refused`` holds the source record ids
    of the refused calls and ``filed`` those of the applied ones (``new`` of them filed now, the
    rest already pending: a repeat). Retry only ``refused``, under new ids; retrying ``filed``
    under new ids would file those records twice. For a replay or a requeue (one call) both are
    empty and nothing was written.
    """

    def __init__(self, msg: str, chunk: bytes = b"", *, filed: tuple[int, ...] = (),
                 refused: tuple[int, ...] = (), new: int = 0) -> None:
        super().__init__(msg)
        self.chunk = chunk
        self.filed = filed
        self.refused = refused
        self.new = new


class InvalidArgumentError(FTLayerError, TypeError, ValueError):
    """A public API call got an argument of the wrong type or out of range; nothing was applied.

    It is both a ``TypeError`` and a ``ValueError`` so callers that catch either keep working.
    """


class InvalidIdError(InvalidArgumentError):
    """A record id or XOR delta is not a signed 64-bit integer (``-2**63 <= x < 2**63``); nothing was applied."""


class ServerSettingsError(FTLayerError):
    """The Redis server runs with a setting under which ftlayer cannot keep its promises.

    The message names the setting, its value and how to change it.
    """


class EvictionPolicyError(ServerSettingsError):
    """The server's ``maxmemory-policy`` lets it evict ftlayer keys (anything but ``noeviction``)."""


class LeaseLostError(FTLayerError):
    """This process no longer holds the rotator lease; another driver rotates now."""


class PartitioningError(FTLayerError):
    """A partitioner was asked for something its strategy cannot do, or a topology mixes strategies unsupported."""


class ChannelCountMismatchError(PartitioningError):
    """The persisted data was written with a different number of channels than this run uses."""


class TopologyError(FTLayerError):
    """A topology is malformed (for example, an operator after a sink, or a stream never sunk)."""


class KeyedStateError(FTLayerError):
    """A key's state of a keyed operator could not be loaded or saved; fails the record that used it."""


class FailRecord(Exception):
    """Raise inside a user function to fail the record it was called with.

    The record's whole tree fails at once and is handed to the replayer, which
    replays it under a new source record id (or dead-letters it after
    ``max_replays``). ``reason`` is stored with the failure and shown in the
    dead-letter queue.

    With ``replay=False`` the record is dead-lettered at once, without spending
    its replays: for errors that are deterministic (a malformed input fails the
    same way every time), e.g.
    ``except ValueError as exc: raise FailRecord(str(exc), replay=False) from exc``.
    A record whose tree fails twice keeps the first failure that reaches Redis.
    """

    def __init__(self, reason: str = "FailRecord raised", *, replay: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.replay = replay


class ServiceStoppedError(FTLayerError):
    """The FT service gave up: Redis stayed unreachable for longer than ``outage_budget_s``."""


class IngestStoppedError(FTLayerError):
    """A source's ingest thread stopped on an error (the user source or one of its hooks raised)."""


class IngestCheckError(FTLayerError):
    """The check of a batch at ingest (a schema) raised instead of judging its records: nothing of that
    batch is persisted or confirmed, and ingest stops with this error."""


class SinkWriteError(FTLayerError):
    """A micro-batch's write still failed after its retries, and the batch must not commit (a stateful
    plan): the query stops; restarted on its checkpoint, it re-runs the batch."""


class RecordFailError(FTLayerError):
    """A row function raised, and its record could not be failed in Redis within ``outage_budget_s``:
    the Spark task fails instead (so the batch cannot commit and ack the record)."""


class SparkConnectUnsupportedError(FTLayerError, TypeError):
    """An API that needs a classic SparkSession (the JVM through Py4J) was given a Spark Connect session.

    The message names the API, what it needs the JVM for, and what runs on Spark Connect instead
    (the DataFrame path: ``ftlayer.read_stream`` ... ``ftlayer.acking``; docs/operations.md).
    """


class ConnectServerError(FTLayerError, RuntimeError):
    """A local Spark Connect server (``runtime.spark.connect_server``) could not be started; the
    message holds the tail of its log."""

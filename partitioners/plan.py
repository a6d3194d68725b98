"""Routing of one source to several successors, and what must be persisted to replay it.

A source may feed several successors, each with its own strategy. A replayed
record must reach, for every successor, a channel that the successor's
strategy allows (the same channel for ``fields``, ``forward`` and ``global``).
The FT layer persists exactly **one key hash and one channel** per record
(``SemiDeserializedRecord.key_hash`` / ``.channel``), as the original design
persisted one hash code per record. Hence:

- ``fields`` successors read the key hash. All ``fields`` successors of one
  source must use the *same* key selector: the same ``key_name`` string, or the
  very same callable object. Different selectors raise
  :class:`~ftlayer.errors.TopologyError` when the plan is built, because a
  replay could follow only one of the keys. Workaround: put a map after the
  source and key the map's output; that keyed edge is downstream of the source
  and is routed by the runtime, not replayed from the source.
- ``forward`` successors read the channel, which is the source partition the
  record came from; they need as many channels as the source has partitions.
- ``rebalance``, ``shuffle``, ``global`` and ``broadcast`` read nothing.

So any mix of strategies can coexist on one source as long as the ``fields``
successors agree on their key. If no successor is ``fields`` the persisted key
hash is unused (any value, like the original's ConstantKeySelector).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ftlayer.channels import validate_num_channels
from ftlayer.errors import PartitioningError, TopologyError
from partitioners.base import Partitioner, RoutedRecord
from partitioners.factory import partitioner_class

KeySelector = str | Callable[..., object]
"""A key selector's identity: an explicit ``key_name`` or the selector function itself."""


@dataclass(frozen=True)
class SuccessorSpec:
    """One successor of a source: its name, strategy, key (``fields`` only) and channel count.

    ``num_channels`` ``None`` means the source's partition count.
    """

    name: str
    strategy: str
    key: KeySelector | None = None
    num_channels: int | None = None


def _as_spec(source: str, item: object) -> SuccessorSpec:
    if isinstance(item, SuccessorSpec):
        return item
    if isinstance(item, tuple) and 2 <= len(item) <= 4:
        return SuccessorSpec(*item)
    msg = (
        f"source {source!r}: a successor must be a SuccessorSpec or a tuple "
        f"(name, strategy, key), got {item!r}"
    )
    raise TopologyError(msg)


def _key_label(key: KeySelector) -> str:
    if isinstance(key, str):
        return f"key_name {key!r}"
    name = getattr(key, "__qualname__", None) or type(key).__name__
    return f"key selector {name} (object at {id(key):#x})"


def _same_key(a: KeySelector, b: KeySelector) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return a is b


class SourceRoutingPlan:
    """Routing from one source to its successors, live and on replay.

    Built and validated once per source (the checks in the module docstring
    run in the constructor). ``num_channels`` is the source's partition count:
    the persisted channel lies in ``[0, num_channels)``. Picklable if the key
    selectors are (strings always are). Holds one stateful partitioner per
    successor, so it is not thread-safe.
    """

    def __init__(
        self,
        source: str,
        num_channels: int,
        successors: Iterable[SuccessorSpec | tuple[str, str, KeySelector | None]],
    ) -> None:
        self._source = source
        self._num_channels = validate_num_channels(num_channels, f"source {source!r}")
        specs = tuple(_as_spec(source, s) for s in successors)
        if not specs:
            msg = f"source {source!r} has no successors; nothing to route or replay"
            raise TopologyError(msg)
        self._specs = specs
        self._key: KeySelector | None = None
        self._partitioners: dict[str, Partitioner] = {}
        key_owner = ""
        for spec in specs:
            self._check_spec(spec)
            if spec.strategy == "fields" and spec.key is not None:
                if self._key is None:
                    self._key, key_owner = spec.key, spec.name
                elif not _same_key(self._key, spec.key):
                    msg = (
                        f"source {source!r}: fields successors {key_owner!r} "
                        f"({_key_label(self._key)}) and {spec.name!r} ({_key_label(spec.key)}) "
                        "use different key selectors, but the FT layer persists one key hash "
                        "per record, so a replay can follow only one key. Use the same key "
                        "selector (same key_name or the same function object) on every fields "
                        "successor of a source, or map after the source and key_by on the "
                        "map's output (a keyed edge downstream of the source is routed by the "
                        "runtime, not replayed from the source)"
                    )
                    raise TopologyError(msg)
            n = self._num_channels if spec.num_channels is None else spec.num_channels
            self._partitioners[spec.name] = partitioner_class(spec.strategy)(n)

    def _check_spec(self, spec: SuccessorSpec) -> None:
        where = f"source {self._source!r}, successor {spec.name!r}"
        if not isinstance(spec.name, str) or not spec.name:
            msg = (
                f"source {self._source!r}: successor names must be non-empty strings, "
                f"got {spec.name!r}"
            )
            raise TopologyError(msg)
        if spec.name in self._partitioners:
            msg = f"{where}: the name is used by two successors of the source"
            raise TopologyError(msg)
        partitioner_class(spec.strategy)  # unknown name -> PartitioningError
        if spec.strategy == "fields" and spec.key is None:
            msg = f"{where}: strategy 'fields' needs a key selector (a key_name or function)"
            raise TopologyError(msg)
        if spec.strategy != "fields" and spec.key is not None:
            msg = f"{where}: strategy {spec.strategy!r} takes no key, but one was given"
            raise TopologyError(msg)
        if (
            spec.strategy == "forward"
            and spec.num_channels is not None
            and spec.num_channels != self._num_channels
        ):
            msg = (
                f"{where}: forward needs as many channels as the source has partitions "
                f"({self._num_channels}), got num_channels={spec.num_channels}"
            )
            raise TopologyError(msg)

    @property
    def source(self) -> str:
        """The source's name."""
        return self._source

    @property
    def num_channels(self) -> int:
        """The source's partition count (and the default channel count of its successors)."""
        return self._num_channels

    @property
    def successors(self) -> tuple[SuccessorSpec, ...]:
        """The successors, in the order given."""
        return self._specs

    @property
    def key_selector(self) -> KeySelector | None:
        """The one key selector whose hash is persisted, or ``None`` if no successor is fields."""
        return self._key

    @property
    def persists_key_hash(self) -> bool:
        """Whether replay reads the persisted key hash (some successor is ``fields``)."""
        return self._key is not None

    @property
    def persists_channel(self) -> bool:
        """Whether replay reads the persisted channel (some successor is ``forward``)."""
        return any(s.strategy == "forward" for s in self._specs)

    def partitioner(self, successor: str) -> Partitioner:
        """The partitioner of one successor; an unknown name raises :class:`TopologyError`."""
        try:
            return self._partitioners[successor]
        except KeyError:
            msg = (
                f"source {self._source!r} has no successor {successor!r}; "
                f"it has {list(self._partitioners)}"
            )
            raise TopologyError(msg) from None

    def live_channels(
        self, key_hash: int | None = None, upstream_channel: int | None = None
    ) -> dict[str, list[int]]:
        """Channels of a live record for every successor (see :meth:`Partitioner.select`)."""
        return {
            name: self._wrap(name, p.select, key_hash, upstream_channel)
            for name, p in self._partitioners.items()
        }

    def replay_channels(self, record: RoutedRecord) -> dict[str, list[int]]:
        """Channels of a replayed record for every successor, from its persisted fields."""
        return {
            name: self._wrap(name, p.select_replay, record)
            for name, p in self._partitioners.items()
        }

    def _wrap(self, name: str, fn: Callable[..., list[int]], *args: object) -> list[int]:
        try:
            return fn(*args)
        except PartitioningError as exc:
            msg = f"source {self._source!r}, successor {name!r}: {exc}"
            raise type(exc)(msg) from exc

    def __repr__(self) -> str:
        succ = ", ".join(f"{s.name}:{s.strategy}" for s in self._specs)
        return f"SourceRoutingPlan({self._source!r}, num_channels={self._num_channels}, [{succ}])"

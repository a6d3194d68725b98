"""A batch in ingest's hands, from the source's values to the parts a persist takes.

:func:`prepare` gives each value its packed payload, key hash and channel, and sets aside (through
``reject``: a dead letter with its reason, FT on) each value whose key selector raises, that cannot
be packed, that its source could not parse (``ingest_rejection``) or that the batch's ``check``
refuses (a schema: ``ingest: does not fit the schema: ...``).

Contract:

- **Once per value.** A value is set aside at most once per batch held: :class:`HeldBatch` records
  each one as its dead letter is written, and a batch prepared again (ingest retries a persist that
  Redis refused; ``stop()`` during an outage hands the same batch to the final attempt) skips them
  and reuses the parts once they are made, so a retry never files a dead letter twice. The held
  batch is matched by identity of its values, in order.
- **The check before any dead letter.** The values that pack are checked first; only then are
  all the batch's rejects written, in the batch's order. A check that raises writes none and
  raises :class:`~ftlayer.errors.IngestCheckError` (naming the batch's size), on every attempt:
  nothing of that batch is persisted or confirmed, and the Ingestor stops with it.
- **Columns.** A check that decodes the values (a schema's, ``with_columns``) hands them on as a
  record batch, one row per value persisted, in order; the chunks keep them
  (``ftlayer.records.chunk_columns``) so the DataFrame path's read need not decode them again.
- **Fast path.** A batch where every value packs, every key hashes and the check passes whole (the
  usual case) takes no Python step per value: the packing and hashing run by ``map`` in C and the
  hashes and channels stay numpy ``int64`` arrays up to the frames. Any failure sorts that batch
  out value by value (lists then).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from ftlayer.errors import IngestCheckError
from ftlayer.records.keyhash import NO_KEY_HASH, key_hash, key_hash_array
from serialization.payload import pack_payload, pack_payloads

__all__ = ["HeldBatch", "Parts", "PayloadCheck", "prepare"]

KeySelector = Callable[[Any], Any]
# the packed payloads of a batch -> {index: reason} of those that must not be persisted
PayloadCheck = Callable[[Sequence[bytes]], dict[int, str]]
# (payloads, key hashes, channels, columns): what a destination's put takes; columns is the record
# batch of the values (row i: payload i) when the check decoded them (a schema), else None
Parts = tuple[list[bytes], Sequence[int], Sequence[int], Any]
# (value, None, reason) or (value, exception, "") -> the dead letter written (retried until it is)
Reject = Callable[..., None]


class HeldBatch:
    """The batch being persisted: its values, the positions already set aside, its parts once made."""

    __slots__ = ("parts", "rejected", "values")

    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self.rejected: set[int] = set()
        self.parts: Parts | None = None

    def holds(self, values: list[Any]) -> bool:
        """True if ``values`` are this batch's values (the same objects, in order)."""
        return values is self.values or (
            len(values) == len(self.values) and all(map(operator.is_, values, self.values)))


def _checked(check: PayloadCheck, payloads: Sequence[bytes]) -> tuple[dict[int, str], Any]:
    """``({index: reason}, columns)``: the misfits, and the values that fit as a record batch if the
    check makes one (its ``with_columns``, a :class:`~runtime.spark.schema_check.SchemaCheck`), else None."""
    try:
        with_columns = getattr(check, "with_columns", None)
        if with_columns is not None:
            bad, columns = with_columns(payloads)
            return bad, columns
        return check(payloads), None
    except Exception as exc:
        msg = f"the check of a batch of {len(payloads)} records at ingest failed: {type(exc).__name__}: {exc}"
        raise IngestCheckError(msg) from exc


def prepare(held: HeldBatch, *, key: KeySelector | None, check: PayloadCheck | None,
            channels_of: Callable[[Any], Sequence[int]], reject: Reject) -> Parts:
    """The parts of ``held``'s values (module contract); ``channels_of`` maps key hashes (a numpy array or
    a list) to channels."""
    if held.parts is not None:
        return held.parts
    values = held.values
    if not held.rejected:
        fast = _fast(values, key)
        if fast is not None:
            bad, columns = ({}, None) if check is None else _checked(check, fast[0])
            if not bad:
                held.parts = (fast[0], fast[1], channels_of(fast[1]), columns)
                return held.parts
    held.parts = _one_by_one(held, key, check, channels_of, reject)
    return held.parts


def _fast(values: list[Any], key: KeySelector | None) -> tuple[list[bytes], Any] | None:
    """Payloads and key hashes (a numpy array) of a batch where nothing fails, else None."""
    try:
        payloads = pack_payloads(values)
        if key is None:
            import numpy as np

            return payloads, np.full(len(values), NO_KEY_HASH, dtype=np.int64)
        return payloads, key_hash_array(list(map(key, values)))
    except Exception:  # a value or a key selector failed: the batch is sorted out one by one
        return None


def _one_by_one(held: HeldBatch, key: KeySelector | None, check: PayloadCheck | None,
                channels_of: Callable[[Any], Sequence[int]], reject: Reject) -> Parts:
    out: list[tuple[int, Any, str]] = []  # (position, exception or None, reason) of each value set aside
    kept: list[tuple[int, bytes, int]] = []  # (position, payload, key hash) of each value that packs
    for i, value in enumerate(held.values):
        if i in held.rejected:  # set aside by an earlier attempt at this batch
            continue
        unparsed = getattr(value, "ingest_rejection", None)  # a source's stand-in for what it could not parse
        if isinstance(unparsed, str):
            out.append((i, None, f"ingest: {unparsed}"))
            continue
        try:
            packed = pack_payload(value)
            h = NO_KEY_HASH if key is None else key_hash(key(value))
        except Exception as exc:
            out.append((i, exc, ""))
            continue
        kept.append((i, packed, h))
    columns = None
    if check is not None and kept:
        misfits, columns = _checked(check, [packed for _, packed, _ in kept])
        out += [(kept[k][0], None, f"ingest: does not fit the schema: {why}") for k, why in misfits.items()]
        kept = [entry for k, entry in enumerate(kept) if k not in misfits]
    for i, error, reason in sorted(out, key=operator.itemgetter(0)):
        reject(held.values[i], error, reason=reason)
        held.rejected.add(i)
    hashes = [h for _, _, h in kept]
    return [packed for _, packed, _ in kept], hashes, channels_of(hashes), columns

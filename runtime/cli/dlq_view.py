"""``ftlayer dlq list`` and ``ftlayer dlq show``: read dead letters, with filters (read-only).

Contract:

- ``list`` shows the dead letters of every selected source (default: all sources of the
  namespace), oldest first, at most ``--limit`` per source: entry id, origin id, replay count,
  first line of the reason, time. ``--reason TEXT`` keeps those whose reason contains TEXT
  (case-insensitive); ``--older-than AGE`` / ``--newer-than AGE`` those dead-lettered at least /
  at most AGE ago (``90s``, ``15m``, ``2h``, ``3d``). With a filter every dead letter of the
  source is read (in pages) to count the matches; without one, only the first ``--limit``.
- ``show ENTRY_ID`` shows one dead letter in full: ids, key hash, channel, replay count, times,
  the whole reason (a traceback for exceptions) and the payload decoded with
  ``serialization.payload.unpack_payload``.
- ``-o json`` prints one document with stable keys (:func:`entry_json`); new keys may be
  added, none renamed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from ftlayer.acker.dead_letter_entry import DeadLetter
from ftlayer.acker.dead_letter_ids import check_entry_ids
from ftlayer.config import FTConfig
from ftlayer.errors import SerializationError
from ftlayer.facade.ft_layer import FTLayer
from runtime.cli.common import format_ms, one_source, render_table, select_sources
from serialization.payload import unpack_payload

JSON_VERSION = 1
PAGE = 1000


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a command takes: reason substring (case-insensitive) and age bounds (s)."""

    reason: str | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DeadLetterFilter:
        return cls(getattr(args, "reason", None), getattr(args, "older_than", None), getattr(args, "newer_than", None))

    @property
    def active(self) -> bool:
        return (self.reason, self.older_than_s, self.newer_than_s) != (None, None, None)

    def matches(self, d: DeadLetter, now_ms: int) -> bool:
        age_s = (now_ms - d.dead_ms) / 1000
        if self.older_than_s is not None and age_s < self.older_than_s:
            return False
        if self.newer_than_s is not None and age_s > self.newer_than_s:
            return False
        return self.reason is None or self.reason.lower() in d.reason.lower()

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "older_than_s": self.older_than_s, "newer_than_s": self.newer_than_s}

    def describe(self) -> str:
        parts = [f"reason contains {self.reason!r}"] if self.reason is not None else []
        if self.older_than_s is not None:
            parts.append(f"older than {self.older_than_s:g}s")
        if self.newer_than_s is not None:
            parts.append(f"newer than {self.newer_than_s:g}s")
        return ", ".join(parts)


def add_filter_options(parser: argparse.ArgumentParser) -> None:
    """--reason, --older-than and --newer-than (:class:`DeadLetterFilter`)."""
    from runtime.cli.common import parse_duration

    parser.add_argument("--reason", default=None, metavar="TEXT",
                        help="only dead letters whose reason contains TEXT (case-insensitive)")
    parser.add_argument("--older-than", type=parse_duration, default=None, metavar="AGE",
                        help="only those dead-lettered at least AGE ago (90s, 15m, 2h, 3d)")
    parser.add_argument("--newer-than", type=parse_duration, default=None, metavar="AGE",
                        help="only those dead-lettered at most AGE ago")


def source_layer(config: FTConfig, topology: str, source: str) -> FTLayer:
    """The source's layer with the shard count it registered with."""
    return FTLayer.registered(config, topology, source)


def iter_dead_letters(dl: FTLayer) -> Iterator[DeadLetter]:
    """Every dead letter of the source now, oldest first (read in pages of :data:`PAGE`)."""
    after = "-"
    while True:
        page = dl.list_dead_letters(count=PAGE, after=after)
        yield from page
        if len(page) < PAGE:
            return
        after = page[-1].entry_id


def matching(dl: FTLayer, flt: DeadLetterFilter, limit: int | None = None) -> tuple[list[DeadLetter], int]:
    """The first ``limit`` (None: all) dead letters that ``flt`` keeps, and how many it keeps in all."""
    now_ms = int(time.time() * 1000)
    kept: list[DeadLetter] = []
    total = 0
    for d in iter_dead_letters(dl):
        if flt.matches(d, now_ms):
            total += 1
            if limit is None or len(kept) < limit:
                kept.append(d)
    return kept, total


def first_line(text: str, width: int = 60) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _jsonable(value: Any) -> Any:
    """A JSON-safe rendering of a decoded payload; types JSON lacks become their repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def _decoded_payload(d: DeadLetter) -> tuple[bool, Any]:
    """(True, value) if the payload decodes, else (False, a short explanation)."""
    if d.record is None:
        return False, f"<undecodable frame of {len(d.frame)} bytes>"
    try:
        return True, unpack_payload(d.record.payload)
    except SerializationError as exc:
        return False, f"<undecodable payload of {len(d.record.payload)} bytes: {exc}>"


def entry_json(topology: str, source: str, d: DeadLetter) -> dict[str, Any]:
    """One dead letter in ``-o json`` (stable keys)."""
    rec = d.record
    return {
        "topology": topology,
        "source": source,
        "entry_id": d.entry_id,
        "source_record_id": d.source_record_id,
        "origin_id": d.origin_id,
        "replay_count": d.replay_count,
        "key_hash": rec.key_hash if rec else None,
        "channel": rec.channel if rec else None,
        "failed_ms": d.failed_ms,
        "dead_ms": d.dead_ms,
        "reason": d.reason,
    }


def cmd_list(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Print the dead letters of the selected sources that the filters keep."""
    sources = select_sources(client, config.namespace, args.topology, args.source)
    flt = DeadLetterFilter.from_args(args)
    found: list[tuple[str, str, DeadLetter]] = []
    more: list[str] = []
    for t, s in sources:
        dl = source_layer(config, t, s)
        if flt.active:
            entries, total = matching(dl, flt, args.limit)
        else:
            entries, total = dl.list_dead_letters(count=args.limit), dl.dead_letter_count()
        found.extend((t, s, d) for d in entries)
        if total > len(entries):
            more.append(f"{t}/{s}: showing {len(entries)} of {total}{' matching' if flt.active else ''} "
                        "(raise --limit)")
    if args.output == "json":
        doc = {
            "version": JSON_VERSION, "namespace": config.namespace, "filters": flt.to_json(),
            "dead_letters": [entry_json(t, s, d) for t, s, d in found], "truncated": more,
        }
        print(json.dumps(doc, indent=2))
        return 0
    if not found:
        which = f" matching ({flt.describe()})" if flt.active else ""
        print(f"no dead letters{which} in {len(sources)} source(s) of namespace {config.namespace!r}")
        return 0
    print(render_table(
        ["SOURCE", "ENTRY ID", "ORIGIN ID", "REPLAYS", "DEAD-LETTERED AT", "REASON"],
        [
            [f"{t}/{s}", d.entry_id, str(d.origin_id if d.origin_id is not None else "?"),
             str(d.replay_count if d.replay_count is not None else "?"), format_ms(d.dead_ms), first_line(d.reason)]
            for t, s, d in found
        ],
        align="llrrll",
    ))
    for line in more:
        print(line)
    return 0


def cmd_show(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Print one dead letter in full."""
    t, s = one_source(client, config, args.topology, args.source)
    d = source_layer(config, t, s).get_dead_letter(check_entry_ids([args.entry_id])[0])
    if d is None:
        print(f"ftlayer: no dead letter {args.entry_id} in {t}/{s}", file=sys.stderr)
        return 1
    ok, value = _decoded_payload(d)
    if args.output == "json":
        doc = {**entry_json(t, s, d), "payload_decoded": ok, "payload": _jsonable(value) if ok else None,
               "payload_repr": repr(value) if ok else value}
        print(json.dumps(doc, indent=2))
        return 0
    rec = d.record
    rows = [
        ("dead letter", f"{d.entry_id} of {t}/{s}"),
        ("source record id", str(d.source_record_id)),
        ("origin id", str(d.origin_id)),
        ("replay count", str(d.replay_count)),
        ("key hash", str(rec.key_hash) if rec else "?"),
        ("channel", str(rec.channel) if rec else "?"),
        ("failed at", f"{format_ms(d.failed_ms)} ({d.failed_ms})"),
        ("dead-lettered at", f"{format_ms(d.dead_ms)} ({d.dead_ms})"),
        ("payload", repr(value) if ok else value),
    ]
    for label, text in rows:
        print(f"{label:<18}{text}")
    print("reason:")
    for line in (d.reason or "(none)").splitlines():
        print(f"  {line}")
    return 0

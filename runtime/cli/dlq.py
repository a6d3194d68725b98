"""``ftlayer dlq list|show|requeue|purge``: inspect dead letters and act on them.

Contract:

- ``list`` shows the dead letters of every selected source (default: all
  sources of the namespace), oldest first, at most ``--limit`` per source:
  entry id, origin id, replay count, first line of the reason, time.
- ``show ENTRY_ID`` shows one dead letter in full: ids, key hash, channel,
  replay count, times, the whole reason (a traceback for exceptions) and the
  payload decoded with ``serialization.payload.unpack_payload``.
- ``requeue ENTRY_ID... | --all`` puts each dead letter back into its channel
  stream as a new source record (new id, replay count 0; origin id, payload,
  key hash and channel kept), atomically with its removal from the dlq.
- ``purge ENTRY_ID... | --all`` deletes only with ``--yes`` or a typed ``yes``
  at an interactive prompt; otherwise it prints what it would delete and
  exits 1. Nothing is ever deleted implicitly.
- ``requeue --all`` and ``purge`` refuse a namespace that ftlayer did not
  create (no ftlayer owner record, see ``ftlayer.store.owner_record``) unless
  ``--force``.
- ``show``, ``requeue`` and ``purge`` act on one source, picked with
  ``--topology`` / ``--source``; they may be left out when only one
  registered source matches.

Exit codes: 0 done; 1 not (entirely) done: ids not found, confirmation not
given; 2 error (bad option, no server, refused namespace).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import redis

from ftlayer.config import FTConfig, mask_url
from ftlayer.dead_letters import DeadLetter, check_entry_ids
from ftlayer.errors import SerializationError
from ftlayer.keys import owner_key
from ftlayer.layer import FTLayer
from ftlayer.store import owner_record
from runtime.cli.common import (
    CLIError,
    connect_configured,
    connection_options,
    format_ms,
    load_config,
    one_source,
    redis_errors,
    render_table,
    select_sources,
    source_options,
)
from serialization.payload import unpack_payload

JSON_VERSION = 1
_PAGE = 1000
_SHOWN = 20  # ids listed before "... and N more" when asking to purge


def _dead_letters(config: FTConfig, topology: str, source: str) -> FTLayer:
    return FTLayer.registered(config, topology, source)  # with the shard count the source has


def _all_ids(dl: FTLayer) -> list[str]:
    """Every entry id in the dlq now, oldest first (read in pages)."""
    ids: list[str] = []
    after = "-"
    while True:
        page = dl.list_dead_letters(count=_PAGE, after=after)
        ids.extend(d.entry_id for d in page)
        if len(page) < _PAGE:
            return ids
        after = page[-1].entry_id


def _require_owner(client: redis.Redis, config: FTConfig, action: str, force: bool) -> None:
    if force or owner_record(client, config.namespace) is not None:
        return
    msg = (
        f"refusing to {action}: namespace {config.namespace!r} at {mask_url(config.redis_url)} has no "
        f"ftlayer owner record ({owner_key(config.namespace)}), so ftlayer did not create it (or it "
        f"predates owner records). Check --namespace / --redis-url; pass --force to {action} anyway"
    )
    raise CLIError(msg)


def _first_line(text: str, width: int = 60) -> str:
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


def _entry_json(topology: str, source: str, d: DeadLetter) -> dict[str, Any]:
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
    """Print the dead letters of the selected sources."""
    sources = select_sources(client, config.namespace, args.topology, args.source)
    found: list[tuple[str, str, DeadLetter]] = []
    more: list[str] = []
    for t, s in sources:
        dl = _dead_letters(config, t, s)
        entries = dl.list_dead_letters(count=args.limit)
        found.extend((t, s, d) for d in entries)
        total = dl.dead_letter_count()
        if total > len(entries):
            more.append(f"{t}/{s}: showing {len(entries)} of {total} (raise --limit)")
    if args.json:
        doc = {
            "version": JSON_VERSION, "namespace": config.namespace,
            "dead_letters": [_entry_json(t, s, d) for t, s, d in found], "truncated": more,
        }
        print(json.dumps(doc, indent=2))
        return 0
    if not found:
        print(f"no dead letters in {len(sources)} source(s) of namespace {config.namespace!r}")
        return 0
    print(render_table(
        ["SOURCE", "ENTRY ID", "ORIGIN ID", "REPLAYS", "DEAD-LETTERED AT", "REASON"],
        [
            [f"{t}/{s}", d.entry_id, str(d.origin_id if d.origin_id is not None else "?"),
             str(d.replay_count if d.replay_count is not None else "?"), format_ms(d.dead_ms), _first_line(d.reason)]
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
    d = _dead_letters(config, t, s).get_dead_letter(check_entry_ids([args.entry_id])[0])
    if d is None:
        print(f"ftlayer: no dead letter {args.entry_id} in {t}/{s}", file=sys.stderr)
        return 1
    ok, value = _decoded_payload(d)
    if args.json:
        doc = {**_entry_json(t, s, d), "payload_decoded": ok, "payload": _jsonable(value) if ok else None,
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


def _targets(args: argparse.Namespace, dl: FTLayer) -> list[str]:
    if bool(args.entry_ids) == bool(args.all):
        msg = f"ftlayer dlq {args.dlq_command}: give either ENTRY_ID... or --all"
        raise CLIError(msg)
    return _all_ids(dl) if args.all else check_entry_ids(args.entry_ids)


def cmd_requeue(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Move dead letters back into their channel streams with replay count 0."""
    t, s = one_source(client, config, args.topology, args.source)
    if args.all:
        _require_owner(client, config, "requeue every dead letter", args.force)
    dl = _dead_letters(config, t, s)
    ids = _targets(args, dl)
    num_channels = dl.recorded_channels()
    if num_channels is None:
        msg = f"source {t}/{s} has no recorded channel count (meta); cannot route requeued records"
        raise CLIError(msg)
    if not ids:
        print(f"no dead letters to requeue in {t}/{s}")
        return 0
    result = dl.requeue_dead_letters(ids, num_channels)
    print(f"requeued {result.requeued} of {len(ids)} dead letter(s) of {t}/{s} (new ids, replay count 0)")
    if result.missing:
        print(f"not in the dlq: {' '.join(result.missing)}")
    if result.undecodable:
        print(f"undecodable, left in the dlq: {' '.join(result.undecodable)}")
    return 0 if result.requeued == len(ids) else 1


def _interactive() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def cmd_purge(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Delete dead letters, only after --yes or a typed confirmation."""
    t, s = one_source(client, config, args.topology, args.source)
    _require_owner(client, config, "purge dead letters", args.force)
    dl = _dead_letters(config, t, s)
    ids = _targets(args, dl)
    missing: list[str] = []
    if not args.all:
        present = {i for i in ids if dl.get_dead_letter(i) is not None}
        missing = [i for i in ids if i not in present]
        if missing:
            print(f"not in the dlq of {t}/{s}: {' '.join(missing)}")
        ids = [i for i in dict.fromkeys(ids) if i in present]
    if not ids:
        print(f"nothing to purge in {t}/{s}")
        return 1 if missing else 0
    print(f"would delete {len(ids)} dead letter(s) from {t}/{s}:")
    for eid in ids[:_SHOWN]:
        print(f"  {eid}")
    if len(ids) > _SHOWN:
        print(f"  ... and {len(ids) - _SHOWN} more")
    if not args.yes:
        if not _interactive():
            print("nothing deleted: pass --yes to delete them")
            return 1
        try:
            answer = input("type 'yes' to delete them: ")
        except EOFError:
            answer = ""
        if answer.strip() != "yes":
            print("nothing deleted")
            return 1
    deleted = sum(dl.purge_dead_letters(ids[i : i + _PAGE]) for i in range(0, len(ids), _PAGE))
    print(f"deleted {deleted} dead letter(s) from {t}/{s}")
    return 1 if missing or deleted < len(ids) else 0


_COMMANDS = {"list": cmd_list, "show": cmd_show, "requeue": cmd_requeue, "purge": cmd_purge}


def check_usage(args: argparse.Namespace) -> None:
    """Refuse a wrong combination of arguments before anything connects (:class:`CLIError`)."""
    if args.dlq_command in ("requeue", "purge"):
        if bool(args.entry_ids) == bool(args.all):
            msg = f"ftlayer dlq {args.dlq_command}: give either ENTRY_ID... or --all (one of them, not both)"
            raise CLIError(msg)
        if args.entry_ids:
            check_entry_ids(args.entry_ids)
    if args.dlq_command == "show":
        check_entry_ids([args.entry_id])


def run_dlq(args: argparse.Namespace) -> int:
    """Dispatch a ``dlq`` subcommand (see the module contract). Returns the exit code."""
    check_usage(args)
    config = load_config(args)
    client = connect_configured(config, f"dlq {args.dlq_command}")
    with redis_errors(config):
        return _COMMANDS[args.dlq_command](args, config, client)


def add_parser(sub: Any) -> None:
    """Add the ``dlq`` command and its subcommands to the CLI's subparsers."""
    p = sub.add_parser("dlq", help="list, show, requeue or purge dead letters")
    dsub = p.add_subparsers(dest="dlq_command", required=True, metavar="{list,show,requeue,purge}")
    common = connection_options()

    pl = dsub.add_parser("list", parents=[common], help="list dead letters (default: every source)")
    source_options(pl)
    pl.add_argument("--limit", type=int, default=100, metavar="N", help="at most N per source (default 100)")
    pl.add_argument("--json", action="store_true", help="print JSON with stable keys")

    ps = dsub.add_parser("show", parents=[common], help="one dead letter in full, payload decoded")
    source_options(ps)
    ps.add_argument("entry_id", metavar="ENTRY_ID",
                    help="the dead letter's stream entry id (from 'list'; <id>@<shard> for a source with shards)")
    ps.add_argument("--json", action="store_true", help="print JSON with stable keys")

    pr = dsub.add_parser(
        "requeue", parents=[common], help="put dead letters back into their stream with replay count 0"
    )
    source_options(pr)
    pr.add_argument("entry_ids", nargs="*", metavar="ENTRY_ID", help="entry ids to requeue")
    pr.add_argument("--all", action="store_true", help="every dead letter of the source")
    pr.add_argument("--force", action="store_true",
                    help="with --all: act even on a namespace without an ftlayer owner record")

    pp = dsub.add_parser("purge", parents=[common], help="delete dead letters (needs --yes or a typed 'yes')")
    source_options(pp)
    pp.add_argument("entry_ids", nargs="*", metavar="ENTRY_ID", help="entry ids to delete")
    pp.add_argument("--all", action="store_true", help="every dead letter of the source")
    pp.add_argument("--yes", action="store_true", help="delete without asking")
    pp.add_argument("--force", action="store_true",
                    help="act even on a namespace without an ftlayer owner record")
    for q in (pl, ps, pr, pp):
        q.set_defaults(func=run_dlq)

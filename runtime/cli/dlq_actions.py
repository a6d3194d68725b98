"""``ftlayer dlq requeue`` and ``ftlayer dlq purge``: act on dead letters of one source.

Contract:

- ``requeue ENTRY_ID... | --all`` puts each dead letter back into its channel stream as a new
  source record (new id, replay count 0; origin id, payload, key hash and channel kept),
  atomically with its removal from the dlq.
- ``purge ENTRY_ID... | --all`` deletes dead letters.
- Confirmation: ``purge`` always, and ``requeue --all`` (a bulk action), print what they would
  do and go on only with ``--yes`` or a typed ``yes`` at a terminal (:mod:`runtime.cli.confirm`);
  otherwise nothing changes and the exit status is 1. ``requeue`` of given ids needs none.
- ``--dry-run`` prints what would be done and changes nothing (no confirmation asked); its exit
  status is the one the real run would have if confirmed (1 if some given ids are not there).
- ``--all`` takes the filters of ``dlq list`` (``--reason``, ``--older-than``, ``--newer-than``):
  every dead letter they keep.
- ``requeue --all`` and ``purge`` refuse a namespace that ftlayer did not create (no ftlayer
  owner record, ``ftlayer.store.owner_record``) unless ``--force``; a dry run refuses too.
"""

from __future__ import annotations

import argparse

import redis

from ftlayer.config import FTConfig, mask_url
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import owner_key
from ftlayer.store.owner_record import owner_record
from runtime.cli.common import CLIError, one_source
from runtime.cli.confirm import confirmed
from runtime.cli.dlq_view import DeadLetterFilter, matching, source_layer

SHOWN = 20  # ids listed before "... and N more"


def require_owner(client: redis.Redis, config: FTConfig, action: str, force: bool) -> None:
    """:class:`CLIError` unless the namespace has ftlayer's owner record (or ``force``)."""
    if force or owner_record(client, config.namespace) is not None:
        return
    msg = (
        f"refusing to {action}: namespace {config.namespace!r} at {mask_url(config.redis_url)} has no "
        f"ftlayer owner record ({owner_key(config.namespace)}), so ftlayer did not create it (or it "
        f"predates owner records). Check --namespace / --redis-url; pass --force to {action} anyway"
    )
    raise CLIError(msg)


def _targets(args: argparse.Namespace, dl: FTLayer) -> tuple[list[str], list[str]]:
    """(entry ids present in the dlq, given ids that are not) for ENTRY_ID... or --all + filters."""
    if args.all:
        return [d.entry_id for d in matching(dl, DeadLetterFilter.from_args(args))[0]], []
    ids = list(dict.fromkeys(args.entry_ids))
    present = [i for i in ids if dl.get_dead_letter(i) is not None]
    return present, [i for i in ids if i not in present]


def _print_ids(heading: str, ids: list[str]) -> None:
    print(heading)
    for eid in ids[:SHOWN]:
        print(f"  {eid}")
    if len(ids) > SHOWN:
        print(f"  ... and {len(ids) - SHOWN} more")


def _which(args: argparse.Namespace) -> str:
    flt = DeadLetterFilter.from_args(args)
    return f" (matching: {flt.describe()})" if args.all and flt.active else ""


def cmd_requeue(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Move dead letters back into their channel streams with replay count 0."""
    t, s = one_source(client, config, args.topology, args.source)
    if args.all:
        require_owner(client, config, "requeue every dead letter", args.force)
    dl = source_layer(config, t, s)
    num_channels = dl.recorded_channels()
    if num_channels is None:
        msg = f"source {t}/{s} has no recorded channel count (meta); cannot route requeued records"
        raise CLIError(msg)
    ids, missing = _targets(args, dl)
    if missing:
        print(f"not in the dlq of {t}/{s}: {' '.join(missing)}")
    if not ids:
        print(f"no dead letters to requeue in {t}/{s}{_which(args)}")
        return 1 if missing else 0
    if args.dry_run or args.all:
        _print_ids(f"would requeue {len(ids)} dead letter(s) of {t}/{s}{_which(args)} (new ids, replay count 0):", ids)
    if args.dry_run:
        print("dry run: nothing requeued")
        return 1 if missing else 0
    if args.all and not confirmed(args.yes, "requeue them", "nothing requeued"):
        return 1
    result = dl.requeue_dead_letters(ids, num_channels)
    print(f"requeued {result.requeued} of {len(ids)} dead letter(s) of {t}/{s} (new ids, replay count 0)")
    if result.missing:
        print(f"not in the dlq: {' '.join(result.missing)}")
    if result.undecodable:
        print(f"undecodable, left in the dlq: {' '.join(result.undecodable)}")
    return 0 if result.requeued == len(ids) and not missing else 1


def cmd_purge(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Delete dead letters, only after --yes or a typed confirmation."""
    t, s = one_source(client, config, args.topology, args.source)
    require_owner(client, config, "purge dead letters", args.force)
    dl = source_layer(config, t, s)
    ids, missing = _targets(args, dl)
    if missing:
        print(f"not in the dlq of {t}/{s}: {' '.join(missing)}")
    if not ids:
        print(f"nothing to purge in {t}/{s}{_which(args)}")
        return 1 if missing else 0
    _print_ids(f"would delete {len(ids)} dead letter(s) from {t}/{s}{_which(args)}:", ids)
    if args.dry_run:
        print("dry run: nothing deleted")
        return 1 if missing else 0
    if not confirmed(args.yes, "delete them", "nothing deleted"):
        return 1
    deleted = sum(dl.purge_dead_letters(ids[i : i + 1000]) for i in range(0, len(ids), 1000))
    print(f"deleted {deleted} dead letter(s) from {t}/{s}")
    return 1 if missing or deleted < len(ids) else 0

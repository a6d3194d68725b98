"""``ftlayer dlq list|show|requeue|purge``: inspect dead letters and act on them.

What each subcommand does is in :mod:`runtime.cli.dlq_view` (list, show: read-only, filters,
``-o json``) and :mod:`runtime.cli.dlq_actions` (requeue, purge: confirmation, ``--dry-run``,
the owner-record guard). ``show``, ``requeue`` and ``purge`` act on one source, picked with
``--topology`` / ``--source``; they may be left out when only one registered source matches.
Nothing is ever deleted implicitly.

Exit codes: 0 done; 1 not (entirely) done: ids not found, confirmation not given; 2 error (bad
option, no server, refused namespace).
"""

from __future__ import annotations

import argparse
from typing import Any

from ftlayer.acker.dead_letter_ids import check_entry_ids
from runtime.cli.common import (
    CLIError,
    add_output_option,
    connected,
    connection_options,
    load_config,
    positive_int,
    redis_errors,
    source_options,
)
from runtime.cli.dlq_actions import cmd_purge, cmd_requeue
from runtime.cli.dlq_view import DeadLetterFilter, add_filter_options, cmd_list, cmd_show

_COMMANDS = {"list": cmd_list, "show": cmd_show, "requeue": cmd_requeue, "purge": cmd_purge}


def check_usage(args: argparse.Namespace) -> None:
    """Refuse a wrong combination of arguments before anything connects (:class:`CLIError`)."""
    if args.dlq_command in ("requeue", "purge"):
        if bool(args.entry_ids) == bool(args.all):
            msg = f"ftlayer dlq {args.dlq_command}: give either ENTRY_ID... or --all (one of them, not both)"
            raise CLIError(msg)
        if args.entry_ids:
            check_entry_ids(args.entry_ids)
            if DeadLetterFilter.from_args(args).active:
                msg = (f"ftlayer dlq {args.dlq_command}: --reason, --older-than and --newer-than choose among "
                       "all dead letters: use them with --all, not with ENTRY_IDs")
                raise CLIError(msg)
    if args.dlq_command == "show":
        check_entry_ids([args.entry_id])


def run_dlq(args: argparse.Namespace) -> int:
    """Dispatch a ``dlq`` subcommand. Returns the exit code."""
    check_usage(args)
    with connected(load_config(args), f"dlq {args.dlq_command}", args.topology) as (config, client), \
            redis_errors(config):
        return _COMMANDS[args.dlq_command](args, config, client)


def _act_options(p: argparse.ArgumentParser, verb: str) -> None:
    p.add_argument("entry_ids", nargs="*", metavar="ENTRY_ID", help=f"entry ids to {verb} (from 'dlq list')")
    p.add_argument("--all", action="store_true",
                   help="every dead letter of the source, or every one the filters below keep")
    add_filter_options(p)
    p.add_argument("--dry-run", action="store_true", help=f"print what would {verb} and change nothing")
    p.add_argument("--yes", action="store_true", help="do it without asking")


def add_parser(sub: Any) -> None:
    """Add the ``dlq`` command and its subcommands to the CLI's subparsers."""
    p = sub.add_parser(
        "dlq", help="list, show, requeue or purge dead letters",
        description="Dead letters: records that failed max_replays times, kept with the reason of their last "
                    "failure in their source's dead-letter stream until requeued or purged. Exit status 0 "
                    "done, 1 not (entirely) done (ids not found, confirmation not given), 2 error.",
    )
    dsub = p.add_subparsers(dest="dlq_command", required=True, metavar="{list,show,requeue,purge}")
    common = connection_options()

    pl = dsub.add_parser(
        "list", parents=[common], help="list dead letters (default: every source)",
        description="List dead letters, oldest first, at most --limit per source: entry id, origin id, "
                    "replay count, first line of the reason, time. Filters by reason and age. Read-only.",
    )
    source_options(pl)
    add_filter_options(pl)
    pl.add_argument("--limit", type=positive_int, default=100, metavar="N", help="at most N per source (default 100)")
    add_output_option(pl)

    ps = dsub.add_parser(
        "show", parents=[common], help="one dead letter in full, payload decoded",
        description="Show one dead letter in full: ids, key hash, channel, replay count, times, the whole "
                    "reason (a traceback for exceptions) and the payload decoded. Read-only.",
    )
    source_options(ps, one=True)
    ps.add_argument("entry_id", metavar="ENTRY_ID",
                    help="the dead letter's stream entry id (from 'list'; <id>@<shard> for a source with shards)")
    add_output_option(ps)

    pr = dsub.add_parser(
        "requeue", parents=[common], help="put dead letters back into their stream with replay count 0",
        description="Put dead letters back into their channel stream as new records (new id, replay count 0; "
                    "origin id, payload, key hash and channel kept), atomically with their removal from the "
                    "dead-letter stream. --all (every dead letter, or those the filters keep) asks for "
                    "confirmation (--yes, or a typed 'yes'); --dry-run shows what would be requeued. "
                    "Requeue after fixing the cause: a poison record comes back after max_replays.",
    )
    source_options(pr, one=True)
    _act_options(pr, "requeue")
    pr.add_argument("--force", action="store_true",
                    help="with --all: act even on a namespace without an ftlayer owner record")

    pp = dsub.add_parser(
        "purge", parents=[common], help="delete dead letters (needs --yes or a typed 'yes')",
        description="Delete dead letters for good. Prints what it would delete, then deletes only with --yes "
                    "or a typed 'yes' at a terminal (otherwise exit 1); --dry-run only prints. Refuses a "
                    "namespace without ftlayer's owner record unless --force.",
    )
    source_options(pp, one=True)
    _act_options(pp, "delete")
    pp.add_argument("--force", action="store_true",
                    help="act even on a namespace without an ftlayer owner record")
    for q in (pl, ps, pr, pp):
        q.set_defaults(func=run_dlq)

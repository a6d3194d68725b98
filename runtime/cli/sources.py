"""``ftlayer sources list|describe|reset``: the sources of a namespace, one source in depth, and
deleting one source's state.

Contract:

- ``list`` (read-only): every registered source with its channel and shard counts, creation
  time, pending, failed-waiting and dead-letter counts and whether an FT service runs it
  (the read model of ``ftlayer status``, :func:`ftlayer.status.read_model.sample`).
- ``describe TOPOLOGY SOURCE`` (read-only): the source's ``meta``, its figures (as ``status``),
  its keys grouped by kind (type, keys, entries, bytes; :func:`ftlayer.status.source_admin.inventory`)
  and its leftovers (state a drained source should not hold, :meth:`FTLayer.leftovers`).
- ``reset TOPOLOGY SOURCE`` deletes every key of the source and its registration
  (:func:`ftlayer.status.source_admin.reset_source`), after printing what it deletes. It refuses while
  records are pending or waiting for replay, an FT service runs the source or micro-batches
  read it (:func:`ftlayer.status.source_admin.reset_blockers`), and on a namespace without ftlayer's
  owner record, unless ``--force``; it deletes only with ``--yes`` or a typed ``yes`` at a
  terminal (else exit 1); ``--dry-run`` prints and changes nothing. Dead letters are deleted
  with the rest: the summary counts them.
- ``-o json`` on ``list`` and ``describe``: one document with stable keys.

Exit codes: 0 done; 1 not done (confirmation not given); 2 error (bad option, no server, no such
source, refused).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import redis

from ftlayer.config import FTConfig, mask_url
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import SourceKeys, check_name
from ftlayer.status.read_model import Snapshot, SourceStatus, registered_sources, sample
from ftlayer.status.source_admin import SourceInventory, inventory, reset_blockers, reset_source
from runtime.cli.common import (
    CLIError,
    add_output_option,
    connected,
    connection_options,
    format_duration,
    format_ms,
    load_config,
    redis_errors,
    render_table,
    select_sources,
    source_options,
)
from runtime.cli.confirm import confirmed
from runtime.cli.dlq_actions import require_owner
from runtime.cli.status import to_json

JSON_VERSION = 1


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover


def _service(s: SourceStatus) -> str:
    return f"alive ({s.lease_owner})" if s.service_alive else "down"


def _one(client: redis.Redis, config: FTConfig, topology: str, source: str) -> Snapshot:
    """The status of one registered source (the snapshot's only one); :class:`CLIError` if it is not
    registered."""
    check_name("topology", topology)
    check_name("source", source)
    if (topology, source) not in registered_sources(client, config.namespace):
        msg = (f"no source {topology}/{source} registered in namespace {config.namespace!r} at "
               f"{mask_url(config.redis_url)} ('ftlayer sources list' shows those that are)")
        raise CLIError(msg)
    return sample(client, config.namespace, [(topology, source)])


def cmd_list(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Print every registered source (matching the filters) with its main figures."""
    snap = sample(client, config.namespace, select_sources(client, config.namespace, args.topology, args.source))
    pipe = client.pipeline(transaction=False)
    for s in snap.sources:
        pipe.hmget(SourceKeys(config.namespace, s.topology, s.source).meta, ["num_shards", "created_ms", "format"])
    metas = pipe.execute() if snap.sources else []
    rows: list[dict[str, Any]] = []
    for s, (shards, created, fmt) in zip(snap.sources, metas, strict=True):
        rows.append({
            "topology": s.topology, "source": s.source, "num_channels": s.num_channels,
            "num_shards": int(shards) if shards is not None else 1,
            "created_ms": int(created) if created is not None else None,
            "format": int(fmt) if fmt is not None else None,
            "pending": s.pending, "failed_waiting": s.failed_waiting, "dead_letters": s.dead_letters,
            "service_alive": s.service_alive,
        })
    if args.output == "json":
        print(json.dumps({"version": JSON_VERSION, "namespace": config.namespace,
                          "redis_url": mask_url(config.redis_url), "sources": rows}, indent=2))
        return 0
    if not rows:
        print(f"no sources registered in namespace {config.namespace!r} at {mask_url(config.redis_url)}")
        return 0
    print(render_table(
        ["SOURCE", "CHANNELS", "SHARDS", "CREATED", "PENDING", "FAILED WAITING", "IN DLQ", "FT SERVICE"],
        [[f"{r['topology']}/{r['source']}", str(r["num_channels"] or "-"), str(r["num_shards"]),
          format_ms(r["created_ms"]), str(r["pending"]), str(r["failed_waiting"]), str(r["dead_letters"]),
          "alive" if r["service_alive"] else "down"] for r in rows],
        align="lrrlrrrl",
    ))
    return 0


def _families(inv: SourceInventory) -> list[dict[str, Any]]:
    """The source's keys grouped by kind: type, keys, entries, bytes (None if unknown)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for k in inv.keys:
        row = out.setdefault((k.family, k.type), {"family": k.family, "type": k.type, "keys": 0, "entries": 0,
                                                  "bytes": 0})
        row["keys"] += 1
        row["entries"] += k.entries
        row["bytes"] = None if row["bytes"] is None or k.bytes is None else row["bytes"] + k.bytes
    return sorted(out.values(), key=lambda r: (r["family"], r["type"]))


def cmd_describe(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Print one source in depth: meta, figures, keys by kind, leftovers."""
    snap = _one(client, config, args.topology_name, args.source_name)
    status = snap.sources[0]
    inv = inventory(client, config.namespace, args.topology_name, args.source_name)
    leftovers = FTLayer.registered(config, args.topology_name, args.source_name).leftovers()
    families = _families(inv)
    if args.output == "json":
        (figures,) = to_json(config, None, snap)["sources"]
        doc = {"version": JSON_VERSION, "namespace": config.namespace, "redis_url": mask_url(config.redis_url),
               "topology": inv.topology, "source": inv.source, "num_shards": inv.num_shards, "meta": inv.meta,
               "status": figures, "key_families": families, "total_bytes": inv.total_bytes,
               "keys": [{"name": k.name, "shard": k.shard, "type": k.type, "entries": k.entries, "bytes": k.bytes}
                        for k in inv.keys],
               "leftovers": leftovers}
        print(json.dumps(doc, indent=2))
        return 0
    c = status.counters
    created = inv.meta.get("created_ms")
    rows = [
        ("source", f"{inv.topology}/{inv.source} in namespace {config.namespace!r} at {mask_url(config.redis_url)}"),
        ("created", format_ms(int(created)) if created else "-"),
        ("channels / shards", f"{status.num_channels or '-'} / {inv.num_shards}"),
        ("layout format", inv.meta.get("format", "-")),
        ("pending", f"{status.pending} (oldest {format_duration(status.oldest_pending_age_s)})"),
        ("failed waiting", str(status.failed_waiting)),
        ("dead letters", str(status.dead_letters)),
        ("bucket gen", str(status.bucket_gen)),
        ("FT service", _service(status)),
        ("ingest", "-" if status.ingest is None else f"{status.ingest.state} {status.ingest.detail}".strip()),
        ("counters", ", ".join(f"{k} {c[k]}" for k in ("persisted", "acked", "failed", "replayed", "dead_lettered",
                                                          "requeued"))),
        ("keys", f"{len(inv.keys)}, {_bytes(inv.total_bytes)}"),
        ("leftovers", " ".join(leftovers) if leftovers else "none (nothing a drained source should not hold)"),
    ]
    for label, text in rows:
        print(f"{label:<19}{text}")
    if families:
        print()
        print(render_table(["KEYS", "TYPE", "COUNT", "ENTRIES", "BYTES"],
                           [[f["family"], f["type"], str(f["keys"]), str(f["entries"]), _bytes(f["bytes"])]
                            for f in families], align="llrrr"))
    return 0


def cmd_reset(args: argparse.Namespace, config: FTConfig, client: redis.Redis) -> int:
    """Delete one source's keys and registration, after the checks and the confirmation."""
    t, s = args.topology_name, args.source_name
    status = _one(client, config, t, s).sources[0]
    require_owner(client, config, f"reset {t}/{s}", args.force)
    blockers = reset_blockers(status, int(time.time() * 1000))
    if blockers and not args.force:
        msg = (f"refusing to reset {t}/{s}: {'; '.join(blockers)}. Stop the query and let it drain "
               "(ftlayer status), or pass --force to delete them anyway")
        raise CLIError(msg)
    inv = inventory(client, config.namespace, t, s)
    print(f"would delete source {t}/{s} of namespace {config.namespace!r} at {mask_url(config.redis_url)}: "
          f"{len(inv.keys)} keys ({_bytes(inv.total_bytes)}) and its registration")
    print(f"  records pending {status.pending}, waiting for replay {status.failed_waiting}, "
          f"dead letters {status.dead_letters} (all deleted)")
    for f in _families(inv):
        print(f"  {f['family']:<8} {f['type']:<7} {f['keys']:>5} key(s) {f['entries']:>9} entries")
    if blockers:
        print(f"  --force: deleting even though {'; '.join(blockers)}")
    print("  not touched: the namespace's other sources and owner record; the Spark checkpoint of a query that "
          "read it (start it with a new one); ftlayer ingest's saved file offsets")
    if args.dry_run:
        print("dry run: nothing deleted")
        return 0
    if not confirmed(args.yes, f"delete {t}/{s}", "nothing deleted"):
        return 1
    deleted = reset_source(client, config.namespace, t, s)
    print(f"deleted {deleted} keys of {t}/{s}; it is no longer registered")
    return 0


_COMMANDS = {"list": cmd_list, "describe": cmd_describe, "reset": cmd_reset}


def run_sources(args: argparse.Namespace) -> int:
    """Dispatch a ``sources`` subcommand. Returns the exit code."""
    topology = getattr(args, "topology", None) or getattr(args, "topology_name", None)  # list | describe, reset
    with connected(load_config(args), f"sources {args.sources_command}", topology) as (config, client), \
            redis_errors(config):
        return _COMMANDS[args.sources_command](args, config, client)


def add_parser(sub: Any) -> None:
    """Add ``ftlayer sources`` and its subcommands to the CLI's subparsers."""
    p = sub.add_parser(
        "sources", help="list the sources of a namespace, describe one, or reset one",
        description="The sources registered in a namespace: list them, describe one in depth (its keys, "
                    "figures and leftovers), or reset one (delete all its state). Exit status 0 done, 1 not "
                    "done (confirmation not given), 2 error.",
    )
    ssub = p.add_subparsers(dest="sources_command", required=True, metavar="{list,describe,reset}")
    common = connection_options()
    pl = ssub.add_parser("list", parents=[common], help="every registered source with its main figures",
                         description="List the sources registered in the namespace: channels, shards, creation "
                                     "time, pending, failed-waiting and dead-letter counts, FT service. Read-only.")
    source_options(pl)
    add_output_option(pl)
    pd = ssub.add_parser("describe", parents=[common], help="one source in depth: meta, figures, keys, leftovers",
                         description="Describe one source: its meta (channels, shards, layout format, creation "
                                     "time), the figures of 'ftlayer status', its Redis keys grouped by kind "
                                     "(type, count, entries, bytes) and its leftovers. Read-only.")
    pr = ssub.add_parser(
        "reset", parents=[common], help="delete every key of one source and its registration",
        description="Delete all state of one source: its records, dead letters, counters, streams and "
                    "registration. Prints what it deletes; refuses while records are pending or waiting for "
                    "replay, while an FT service or a micro-batch uses the source, or on a namespace without "
                    "ftlayer's owner record, unless --force; deletes only with --yes or a typed 'yes'. The "
                    "next query or ingest on the same names starts from nothing (give the query a new checkpoint).",
    )
    for q in (pd, pr):
        q.add_argument("topology_name", metavar="TOPOLOGY", help="topology name")
        q.add_argument("source_name", metavar="SOURCE", help="source name")
    add_output_option(pd)
    pr.add_argument("--dry-run", action="store_true", help="print what would be deleted and change nothing")
    pr.add_argument("--yes", action="store_true", help="delete without asking")
    pr.add_argument("--force", action="store_true",
                    help="delete even with records pending, a query running, or no ftlayer owner record")
    for q in (pl, pd, pr):
        q.set_defaults(func=run_sources)

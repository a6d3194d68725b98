"""``ftlayer status``: what the FT layer of each registered source is doing right now.

For every source registered in the namespace (``<namespace>:sources``) it
shows pending records and the age of the oldest one, records failed and
waiting for replay, dead letters kept, the current bucket generation, whether
an FT service holds the source's rotator lease (owner and TTL), and the
counters (persisted, acked, failed explicitly and by timeout, replayed,
dead-lettered, requeued) as totals and per-second rates.

Contract:

- Read-only: it never writes a key. With no Redis URL it reads the state of a topology run here that
  has ended (:mod:`runtime.cli.stopped_state`), never an empty embedded server.
- Rates come from two samples ``--interval`` seconds apart (0 disables them),
  and in ``--watch`` mode from consecutive refreshes. A counter that went
  down (keys deleted) has no rate.
- The oldest-pending age is ``now - gtime[oldest bucket with pending records]``:
  an upper bound, accurate to one rotation interval; ``None`` when nothing is
  pending or the bucket's start time is unknown (a source registered by an
  older ftlayer, until a few rotations have passed).
- ``-o json`` (or ``--json``) prints one object with the stable keys of :func:`to_json`
  (indented; one compact object per line with ``--watch``): ``version``,
  ``namespace``, ``redis_url`` (masked), ``time_ms``, ``rate_window_s`` and
  ``sources``, a list of objects with ``topology``, ``source``,
  ``num_channels``, ``pending``, ``oldest_pending_age_s``,
  ``failed_waiting``, ``dead_letters``, ``bucket_gen``, ``counters`` (every
  ``ftlayer.store.source_store.COUNTERS`` name plus ``failed`` = explicit + timeout),
  ``rates_per_s`` (``RATE_COUNTERS``, per second, null without a window),
  ``service`` (``alive``, ``owner``, ``lease_ttl_s``) and ``ingest``
  (``state``, ``detail``, ``since_ms``, as the driver's ingest thread last
  recorded them, see :mod:`ftlayer.status.ingest_state`; null if never recorded).
- The INGEST column shows ``ERROR: <error>`` for an ingest thread that
  stopped on an error (its source raised): such a source is never drained.
- The SINK column shows the sink breaker while it is open (``OPEN for 12s, 5 failed
  writes, replays paused (...)``: an acking point retries a failed write, see
  :mod:`ftlayer.acker.breaker`), else the micro-batches running now that read the source and
  for how long (their holds, :mod:`ftlayer.acker.holds`). In ``--json``: ``sink_breaker``
  (``query``, ``since_ms``, ``failures``, ``error``, ``until_ms``; null when closed) and
  ``running_batches`` (``tag``, ``running_s``, ``held_until_ms`` each).
- The Redis URL is shown with its password masked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ftlayer.config import FTConfig, mask_url
from ftlayer.status.read_model import Snapshot, SourceStatus, sample
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

JSON_VERSION = 1
RATE_COUNTERS = ("persisted", "acked", "failed", "replayed", "dead_lettered", "requeued")


def rates(prev: Snapshot | None, cur: Snapshot) -> dict[str, dict[str, float | None]]:
    """Per source name, per counter of ``RATE_COUNTERS``: increase per second since ``prev``."""
    before = {s.name: s for s in prev.sources} if prev else {}
    dt = cur.monotonic_s - prev.monotonic_s if prev else 0.0
    out: dict[str, dict[str, float | None]] = {}
    for s in cur.sources:
        old = before.get(s.name)
        row: dict[str, float | None] = {}
        for c in RATE_COUNTERS:
            delta = s.counters[c] - old.counters[c] if old else -1
            row[c] = round(delta / dt, 3) if old and dt > 0 and delta >= 0 else None
        out[s.name] = row
    return out


def to_json(config: FTConfig, prev: Snapshot | None, cur: Snapshot) -> dict[str, Any]:
    """The ``--json`` document. Keys are stable; new keys may be added, none renamed."""
    r = rates(prev, cur)
    return {
        "version": JSON_VERSION,
        "namespace": config.namespace,
        "redis_url": mask_url(config.redis_url),
        "time_ms": cur.time_ms,
        "rate_window_s": round(cur.monotonic_s - prev.monotonic_s, 3) if prev else None,
        "sources": [
            {
                "topology": s.topology,
                "source": s.source,
                "num_channels": s.num_channels,
                "pending": s.pending,
                "oldest_pending_age_s": s.oldest_pending_age_s,
                "failed_waiting": s.failed_waiting,
                "dead_letters": s.dead_letters,
                "bucket_gen": s.bucket_gen,
                "counters": s.counters,
                "rates_per_s": r[s.name],
                "service": {"alive": s.service_alive, "owner": s.lease_owner, "lease_ttl_s": s.lease_ttl_s},
                "ingest": None if s.ingest is None else {
                    "state": s.ingest.state, "detail": s.ingest.detail, "since_ms": s.ingest.since_ms,
                },
                "sink_breaker": None if not s.breaker_open(cur.time_ms) or s.breaker is None else {
                    "query": s.breaker.query, "since_ms": s.breaker.since_ms, "failures": s.breaker.failures,
                    "error": s.breaker.error, "until_ms": s.breaker.until_ms,
                },
                "running_batches": [
                    {"tag": h.tag, "running_s": round((cur.time_ms - h.started_ms) / 1000, 3),
                     "held_until_ms": h.deadline_ms}
                    for h in s.running_batches(cur.time_ms)
                ],
            }
            for s in cur.sources
        ],
    }


def _service(s: SourceStatus) -> str:
    if not s.service_alive:
        return "DOWN (no rotator lease)"
    ttl = "no expiry" if s.lease_ttl_s is None else f"{s.lease_ttl_s:.1f}s left"
    return f"alive (owner {s.lease_owner}, lease {ttl})"


def _ingest(s: SourceStatus) -> str:
    if s.ingest is None:
        return "-"
    if s.ingest.failed:
        return f"ERROR: {s.ingest.detail[:120]}"
    return s.ingest.state if not s.ingest.detail else f"{s.ingest.state} ({s.ingest.detail[:80]})"


def _sink(s: SourceStatus, now_ms: int) -> str:
    """The SINK column: the sink breaker while a write fails, else the batches running now."""
    if s.breaker is not None and s.breaker_open(now_ms):
        b = s.breaker
        return (f"OPEN for {format_duration((now_ms - b.since_ms) / 1000)}, {b.failures} failed writes, "
                f"replays paused ({b.error[:60]})")
    running = s.running_batches(now_ms)
    if not running:
        return "-"
    longest = max(now_ms - h.started_ms for h in running) / 1000
    return f"{len(running)} batch{'es' if len(running) > 1 else ''} running ({format_duration(longest)})"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def render_human(config: FTConfig, prev: Snapshot | None, cur: Snapshot) -> str:
    """The default output: a state table and a counters table with a rate row per source."""
    window = f"rates over the last {cur.monotonic_s - prev.monotonic_s:.1f} s" if prev else "no rates"
    head = (
        f"ftlayer status: namespace {config.namespace!r} at {mask_url(config.redis_url)}, "
        f"{format_ms(cur.time_ms)} ({window})"
    )
    if not cur.sources:
        return head + (
            f"\n\nno sources registered in namespace {config.namespace!r} "
            "(check --namespace / FTLAYER_NAMESPACE, or the --topology / --source filters)"
        )
    state = render_table(
        ["SOURCE", "PENDING", "OLDEST PENDING", "FAILED WAITING", "IN DLQ", "BUCKET GEN", "CHANNELS", "FT SERVICE",
         "INGEST", "SINK"],
        [
            [
                s.name, str(s.pending), format_duration(s.oldest_pending_age_s), str(s.failed_waiting),
                str(s.dead_letters), str(s.bucket_gen), "-" if s.num_channels is None else str(s.num_channels),
                _service(s), _ingest(s), _sink(s, cur.time_ms),
            ]
            for s in cur.sources
        ],
        align="lrrrrrrlll",
    )
    r = rates(prev, cur)
    rows: list[list[str]] = []
    for s in cur.sources:
        c = s.counters
        rows.append([
            s.name, str(c["persisted"]), str(c["acked"]),
            f"{c['failed']} ({c['failed_explicit']}+{c['failed_timeout']})",
            str(c["replayed"]), str(c["dead_lettered"]), str(c["requeued"]),
        ])
        rr = r[s.name]
        rows.append(["  per second", *(_rate(rr[k]) for k in RATE_COUNTERS)])
    totals = render_table(
        ["COUNTERS", "PERSISTED", "ACKED", "FAILED (EXPL+TIMEOUT)", "REPLAYED", "DEAD-LETTERED", "REQUEUED"], rows
    )
    return f"{head}\n\n{state}\n\n{totals}"


def _emit(args: argparse.Namespace, config: FTConfig, prev: Snapshot | None, cur: Snapshot, frame: int) -> None:
    if args.output == "json":
        doc = to_json(config, prev, cur)
        print(json.dumps(doc) if args.watch is not None else json.dumps(doc, indent=2), flush=True)
        return
    if args.watch is not None:
        if sys.stdout.isatty():
            print("\x1b[H\x1b[2J", end="")
        elif frame:
            print()
    print(render_human(config, prev, cur), flush=True)


def run_status(args: argparse.Namespace) -> int:
    """The ``status`` command (see the module contract). Returns the exit code."""
    if args.count is not None and args.watch is None:
        msg = "--count only applies to --watch"
        raise CLIError(msg)
    if args.interval < 0 or (args.watch is not None and args.watch <= 0):
        msg = "--interval must be >= 0 and --watch SECONDS > 0"
        raise CLIError(msg)
    with connected(load_config(args), "status", args.topology) as (config, client):
        return _status(args, config, client)


def _status(args: argparse.Namespace, config: FTConfig, client: Any) -> int:
    ns = config.namespace

    def take() -> Snapshot:
        return sample(client, ns, select_sources(client, ns, args.topology, args.source))

    try:
        with redis_errors(config):
            prev: Snapshot | None = None
            if args.interval > 0:
                prev = take()
                time.sleep(args.interval)
            cur = take()
            _emit(args, config, prev, cur, 0)
            frame = 1
            while args.watch is not None and (args.count is None or frame < args.count):
                time.sleep(args.watch)
                prev, cur = cur, take()
                _emit(args, config, prev, cur, frame)
                frame += 1
    except KeyboardInterrupt:
        if args.watch is None:
            raise
    return 0


def add_parser(sub: Any) -> None:
    """Add the ``status`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "status", parents=[connection_options()],
        help="pending, failed, replayed and dead-lettered records per source, and the FT service",
        description=(
            "Per topology and source: pending records and the age of the oldest, failed records waiting "
            "for replay, dead letters, counters with recent rates, the bucket generation, and whether an "
            "FT service holds the rotator lease. Read-only. With no Redis URL configured it reads the state of a "
            "topology run in this directory that has ended (<state_dir>/<topology>/redis/)."
        ),
    )
    source_options(p)
    add_output_option(p)
    p.add_argument(
        "--interval", type=float, default=1.0, metavar="SECONDS",
        help="seconds between the two samples the rates are computed from; 0 skips rates (default 1)",
    )
    p.add_argument(
        "--watch", type=float, nargs="?", const=2.0, default=None, metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C; rates are then taken between refreshes",
    )
    p.add_argument("--count", type=int, default=None, metavar="N", help="with --watch: stop after N refreshes")
    p.set_defaults(func=run_status)

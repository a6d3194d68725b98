"""``ftlayer chaos <scenario>``: run a fault-injection scenario and print the checker's report.

The scenarios themselves are the library :mod:`runtime.chaos`; this module is only the
command: options (each naming its env var), the generated namespace, the work directory,
and the exit status (0 when every report is OK). The parser reads the scenarios' names and
summaries from :mod:`runtime.chaos.catalog`; the harness (Spark, the topology) is imported only
when a scenario runs, so every other command starts without it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from ftlayer.config import DURABILITY_MODES, FTConfig
from ftlayer.config.options import SINGLE_SERVER_DURABILITY
from ftlayer.servers.process_server import resolved
from ftlayer.store.connection import client_for
from runtime.chaos.catalog import CATALOG, OWN_SERVER
from runtime.cli.common import connection_options, load_config
from runtime.cli.env import add_env_options, command_env_epilog


def add_parser(sub: Any) -> None:
    """Add ``ftlayer chaos`` to the CLI's subparsers."""
    namespace_help = ("key prefix of the chaos run; default a fresh 'chaos<8 hex digits>' namespace, deleted "
                      "afterwards unless --keep [env FTLAYER_NAMESPACE]")
    p = sub.add_parser(
        "chaos", parents=[connection_options(namespace_help=namespace_help)],
        help="run a fault-injection scenario on local Spark and report what was lost, leaked, replayed",
        description="Run a chaos scenario on a local SparkSession (local[2,4], or --master) and print the checker's "
                    "report. Exit status 0 if nothing was lost or leaked and the scenario's expectations "
                    "held, 1 otherwise. Scenarios: " + "; ".join(f"{k}: {v.summary}" for k, v in CATALOG.items()),
        epilog=command_env_epilog("chaos"),
    )
    p.add_argument("scenario", choices=sorted(CATALOG), help="the scenario to run")
    add_env_options(p, "chaos")
    p.set_defaults(func=_cmd_chaos)


def _cmd_chaos(args: argparse.Namespace) -> int:
    generated = args.namespace is None and not os.environ.get("FTLAYER_NAMESPACE")
    if generated:
        args.namespace = "chaos" + uuid.uuid4().hex[:8]  # never mix chaos records with real ones
    config = load_config(args)
    name: str = args.scenario
    records = int(args.records) if args.records else None
    spark = None
    if CATALOG[name].needs_spark:
        from runtime.spark.session import local_session, stop_session

        spark = local_session(f"ftlayer-chaos-{name}", master=args.master, log_level="ERROR")
    runs: list[dict[str, Any]] = [{}]
    if name in ("kill-redis", "kill-primary"):
        every = SINGLE_SERVER_DURABILITY if name == "kill-redis" else DURABILITY_MODES
        default = "all" if name == "kill-redis" else "replicated"
        chosen = default if args.durability is None else args.durability
        if chosen != "all" and chosen not in every:
            print(f"ftlayer chaos: {name} takes --durability {' | '.join(every)} | all, not {chosen!r}",
                  file=sys.stderr)
            return 2
        modes = every if chosen == "all" else (chosen,)
        runs = [{"durability": m} for m in modes]
        if config.redis_url:
            print(f"ftlayer chaos: {name} kills a server it starts itself; --redis-url is not used")
    elif name in OWN_SERVER:
        if config.redis_url:
            print(f"ftlayer chaos: {name} kills a server it starts itself; --redis-url is not used")
    elif not config.redis_url:
        config = resolved(config)  # the embedded server (not killed by any other scenario)
    try:
        return _run_cli(args, name=name, config=config, records=records, spark=spark, runs=runs,
                        generated=generated)
    finally:
        if spark is not None:
            stop_session(spark)  # before exit, so the JVM does not outlive us and report to a closed gateway


def _run_cli(args: argparse.Namespace, *, name: str, config: FTConfig, records: int | None, spark: Any,
             runs: list[dict[str, Any]], generated: bool) -> int:
    """Run each of ``runs`` (parameter sets), print the reports; 0 if all are OK."""
    from runtime.chaos.base import new_workdir
    from runtime.chaos.runner import run_scenario

    ok = True
    for params in runs:
        temp = not args.workdir
        workdir = new_workdir(name) if temp else Path(args.workdir) / "-".join([name, *params.values()])
        try:
            report = run_scenario(name, spark, config, records, workdir=workdir, strict=args.strict,
                                  pipeline=args.pipeline, sink=args.sink, sink_url=args.sink_url,
                                  say=lambda m: print(f"[chaos {name}] {m}", flush=True), **params)
        finally:
            if temp and not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        if args.keep or not temp:
            report.notes.append(f"work directory {workdir}")
        print(report.summary(), flush=True)
        ok = ok and report.ok
    if generated and not args.keep and name not in OWN_SERVER and config.redis_url:
        _delete_namespace(config)  # only a namespace this command made up
    return 0 if ok else 1


def _delete_namespace(config: FTConfig) -> None:
    """Delete the chaos namespace's keys (kill-redis's own server is gone already)."""
    client = client_for(config.redis_url, config.connect_timeout_s)
    keys = list(client.scan_iter(match=f"{config.namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])

"""The fault-injection harness: run a chaos scenario from pytest or from ``ftlayer chaos <scenario>``.

::

    report = run_scenario("fail-rate", spark, config, records=3000)
    assert report.ok, report.summary()

Every scenario runs the chaos topology (:mod:`runtime.chaos_base`) on real Spark and a real
Redis server under real faults, then the checker (:mod:`runtime.checker`): nothing lost,
nothing leaked, duplicates and replays counted and explained, plus the scenario's own
expectations. docs/fault-injection.md lists the scenarios and what each asserts.

Contract of :func:`run_scenario`: ``config`` gives the Redis server and namespace (its
timeouts are replaced by the scenario's); use a fresh namespace per run. ``records``
defaults to the scenario's CI size. Extra keyword ``params`` go to the scenario (e.g.
``rate=0.1`` for fail-rate, ``durability="waitaof"`` for kill-redis). It raises
:class:`~runtime.chaos_base.ChaosError` for an unknown scenario or parameter, or a query that
keeps dying; otherwise it returns the report, whatever it found.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftlayer.config import DURABILITY_MODES, FTConfig
from ftlayer.connection import client_for, resolved
from runtime import chaos_procs, chaos_scenarios, chaos_webhook
from runtime.chaos_base import ChaosError, ScenarioContext, new_workdir
from runtime.checker import Report


@dataclass(frozen=True)
class Scenario:
    """A registered scenario: its function, CI size, and whether it needs a SparkSession here."""

    run: Callable[..., Report]
    records: int
    summary: str
    needs_spark: bool = True


SCENARIOS: dict[str, Scenario] = {
    "fail-rate": Scenario(chaos_scenarios.fail_rate, 3000, "FailRecord in a user function at a rate"),
    "kill-worker": Scenario(chaos_scenarios.kill_worker, 2000, "a Python worker killed mid-partition"),
    "batch-fails": Scenario(chaos_scenarios.batch_fails, 3000, "a whole micro-batch fails; the query restarts"),
    "kill-driver": Scenario(chaos_procs.kill_driver, 1500, "the driver SIGKILLed and restarted",
                            needs_spark=False),
    "kill-redis": Scenario(chaos_procs.kill_redis, 3000, "the Redis server SIGKILLed, restarted from its AOF "
                                                         "after 3 s"),
    "long-outage": Scenario(chaos_procs.long_outage, 3000, "the Redis server down for 60 s mid-stream"),
    "webhook-driver-kill": Scenario(chaos_webhook.webhook_driver_kill, 1500, "a webhook-fed driver SIGKILLed under "
                                    "load, restarted on the same port", needs_spark=False),
    "drop-connections": Scenario(chaos_scenarios.drop_connections, 3000, "CLIENT KILL every 200 ms"),
    "duplicate-flushes": Scenario(chaos_scenarios.duplicate_flushes, 2000, "every flush sent twice"),
    "delayed-acks": Scenario(chaos_scenarios.delayed_acks, 2000, "acks delayed past the timeout"),
    "poison": Scenario(chaos_scenarios.poison, 2000, "a record that always fails"),
    "mixed": Scenario(chaos_scenarios.mixed, 3000, "fail-rate + kill-worker + drop-connections + poison "
                                                   "+ duplicate-flushes"),
    "soak": Scenario(chaos_scenarios.soak, 1_000_000, "the mixed faults for a long run (not for CI)"),
}


# scenarios that start (and kill) a Redis server of their own
OWN_SERVER = frozenset({"kill-redis", "long-outage"})


def run_scenario(
    name: str,
    spark: Any,
    config: FTConfig,
    records: int | None = None,
    *,
    workdir: str | Path | None = None,
    say: Callable[[str], None] | None = None,
    **params: Any,
) -> Report:
    """Run scenario ``name`` and return the checker's report (see the module contract)."""
    scenario = SCENARIOS.get(name)
    if scenario is None:
        msg = f"unknown chaos scenario {name!r}; choose one of {sorted(SCENARIOS)}"
        raise ChaosError(msg)
    accepted = inspect.signature(scenario.run).parameters
    has_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(set(params) - set(accepted) - {"strict"}) if not has_kwargs else []
    if unknown:
        msg = f"chaos scenario {name!r} takes no parameter {unknown[0]!r}"
        raise ChaosError(msg)
    strict = bool(params.pop("strict", False))
    cfg = config if name in OWN_SERVER else resolved(config)
    path = Path(workdir) if workdir is not None else new_workdir(name)
    path.mkdir(parents=True, exist_ok=True)
    ctx = ScenarioContext(name, spark, cfg, path, strict=strict, say=say or (lambda _m: None))
    report = scenario.run(ctx, records or scenario.records, **params)
    report.strict = ctx.strict
    return report


# --- the `ftlayer chaos` command -----------------------------------------------------------------


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def add_parser(sub: Any) -> None:
    """Add ``ftlayer chaos`` to the CLI's subparsers."""
    from runtime.cli_common import connection_options

    p = sub.add_parser(
        "chaos", parents=[connection_options()],
        help="run a fault-injection scenario on local Spark and report what was lost, leaked, replayed",
        description="Run a chaos scenario on a local SparkSession (local[2,4]) and print the checker's "
                    "report. Exit status 0 if nothing was lost or leaked and the scenario's expectations "
                    "held, 1 otherwise. Scenarios: " + "; ".join(f"{k}: {v.summary}" for k, v in SCENARIOS.items()),
    )
    p.add_argument("scenario", choices=sorted(SCENARIOS), help="the scenario to run")
    p.add_argument("--records", type=int, default=_env("FTLAYER_CHAOS_RECORDS"),
                   help="records to emit; default the scenario's CI size (soak: 1000000) [env FTLAYER_CHAOS_RECORDS]")
    p.add_argument("--durability", choices=(*DURABILITY_MODES, "all"), default=_env("FTLAYER_CHAOS_DURABILITY", "all"),
                   help="kill-redis only: the durability mode to test, or 'all' for each in turn; default all "
                        "[env FTLAYER_CHAOS_DURABILITY]")
    p.add_argument("--workdir", default=_env("FTLAYER_CHAOS_WORKDIR"), metavar="DIR",
                   help="directory for the sink output, fault marks and checkpoint; default a new temporary "
                        "directory [env FTLAYER_CHAOS_WORKDIR]")
    p.add_argument("--strict", action="store_true", default=_env("FTLAYER_CHAOS_STRICT") == "1",
                   help="also fail on replays no injected fault explains [env FTLAYER_CHAOS_STRICT=1]")
    p.add_argument("--keep", action="store_true", default=_env("FTLAYER_CHAOS_KEEP") == "1",
                   help="keep the temporary work directory and the generated namespace's Redis keys "
                        "(default: remove them; a --namespace you name is never deleted) [env FTLAYER_CHAOS_KEEP=1]")
    p.set_defaults(func=_cmd_chaos)


def _cmd_chaos(args: argparse.Namespace) -> int:
    from runtime.cli_common import load_config

    generated = args.namespace is None and not os.environ.get("FTLAYER_NAMESPACE")
    if generated:
        args.namespace = "chaos" + uuid.uuid4().hex[:8]  # never mix chaos records with real ones
    config = load_config(args)
    name: str = args.scenario
    records = int(args.records) if args.records else None
    spark = None
    if SCENARIOS[name].needs_spark:
        from runtime.spark import local_session

        spark = local_session(f"ftlayer-chaos-{name}")
    runs: list[dict[str, Any]] = [{}]
    if name == "kill-redis":
        modes = DURABILITY_MODES if args.durability == "all" else (args.durability,)
        runs = [{"durability": m} for m in modes]
        if config.redis_url:
            print("ftlayer chaos: kill-redis kills a server it starts itself; --redis-url is not used")
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
            spark.stop()  # before exit, so the JVM does not outlive us and report to a closed gateway


def _run_cli(args: argparse.Namespace, *, name: str, config: FTConfig, records: int | None, spark: Any,
             runs: list[dict[str, Any]], generated: bool) -> int:
    """Run each of ``runs`` (parameter sets), print the reports; 0 if all are OK."""
    ok = True
    for params in runs:
        temp = not args.workdir
        workdir = new_workdir(name) if temp else Path(args.workdir) / "-".join([name, *params.values()])
        try:
            report = run_scenario(name, spark, config, records, workdir=workdir, strict=args.strict,
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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runtime.chaos <scenario> ...`` (the same as ``ftlayer chaos``)."""
    from runtime.cli import main as cli_main

    return cli_main(["chaos", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The fault-injection harness: run a chaos scenario from pytest or from ``ftlayer chaos <scenario>``.

::

    report = run_scenario("fail-rate", spark, config, records=3000)
    assert report.ok, report.summary()

Every scenario runs the chaos topology (:mod:`runtime.chaos.base`) on real Spark and a real
Redis server under real faults, then the checker (:mod:`runtime.checker`): nothing lost,
nothing leaked, duplicates and replays counted and explained, plus the scenario's own
expectations. docs/fault-injection.md lists the scenarios and what each asserts.

Contract of :func:`run_scenario`: ``config`` gives the Redis server and namespace (its
timeouts are replaced by the scenario's); use a fresh namespace per run. ``records``
defaults to the scenario's CI size. Extra keyword ``params`` go to the scenario (e.g.
``rate=0.1`` for fail-rate, ``durability="waitaof"`` for kill-redis); ``pipeline="dataframe"``
runs a scenario's DataFrame variant (:mod:`runtime.chaos.dataframe`); ``sink="postgres"`` (or
``"delta"``, ``"redis"``; ``sink_url=`` for a server of yours) writes through that effectively-once
sink and checks that it holds no record twice (:mod:`runtime.chaos.targets`). It raises
:class:`~runtime.chaos.base.ChaosError` for an unknown scenario or parameter, or a query that
keeps dying; otherwise it returns the report, whatever it found.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.servers.process_server import resolved
from runtime.chaos import cluster as chaos_cluster
from runtime.chaos import executors as chaos_executors
from runtime.chaos import ingest_procs as chaos_ingest
from runtime.chaos import mqtt as chaos_mqtt
from runtime.chaos import procs as chaos_procs
from runtime.chaos import receivers as chaos_receivers
from runtime.chaos import scenarios as chaos_scenarios
from runtime.chaos import webhook as chaos_webhook
from runtime.chaos.base import ScenarioContext, new_workdir, remove_scratch
from runtime.chaos.catalog import CATALOG, NO_TARGET, OWN_SERVER
from runtime.chaos.errors import ChaosError
from runtime.chaos.targets import SINKS, open_target
from runtime.checker import Report


@dataclass(frozen=True)
class Scenario:
    """A registered scenario: its function, CI size, and whether it needs a SparkSession here."""

    run: Callable[..., Report]
    records: int
    summary: str
    needs_spark: bool = True


def _dataframe_only(name: str) -> Callable[..., Report]:
    def run(ctx: ScenarioContext, records: int, **_params: Any) -> Report:
        msg = f"chaos scenario {name!r} runs on the DataFrame pipeline only: add --pipeline dataframe"
        raise ChaosError(msg)

    return run


# the function of each scenario in runtime.chaos.catalog (which holds its size, summary and needs_spark)
_RUN: dict[str, Callable[..., Report]] = {
    "fail-rate": chaos_scenarios.fail_rate,
    "kill-worker": chaos_scenarios.kill_worker,
    "kill-executor": chaos_executors.kill_executor,
    "batch-fails": chaos_scenarios.batch_fails,
    "kill-driver": chaos_procs.kill_driver,
    "kill-redis": chaos_procs.kill_redis,
    "long-outage": chaos_procs.long_outage,
    "kill-ingest": chaos_ingest.kill_ingest,
    "kill-primary": chaos_cluster.kill_primary,
    "webhook-driver-kill": chaos_webhook.webhook_driver_kill,
    "webhook-driver-front-kill": chaos_webhook.webhook_front_kill_in_driver,
    "mqtt-driver-kill": chaos_mqtt.mqtt_driver_kill,
    "mqtt-ingest-kill": chaos_receivers.mqtt_ingest_kill,
    "mqtt-broker-kill": chaos_receivers.mqtt_broker_kill,
    "webhook-keepalive": chaos_receivers.webhook_keepalive,
    "webhook-front-kill": chaos_receivers.webhook_front_kill,
    "drop-connections": chaos_scenarios.drop_connections,
    "duplicate-flushes": chaos_scenarios.duplicate_flushes,
    "delayed-acks": chaos_scenarios.delayed_acks,
    "poison": chaos_scenarios.poison,
    "slow-sink": _dataframe_only("slow-sink"),
    "sink-outage": _dataframe_only("sink-outage"),
    "aggregate": _dataframe_only("aggregate"),
    "mixed": chaos_scenarios.mixed,
    "soak": chaos_scenarios.soak,
}
if set(_RUN) != set(CATALOG):  # a scenario named in one table only: fail at import, not when it is chosen
    _msg = f"chaos scenarios without a function or without a catalog entry: {sorted(set(_RUN) ^ set(CATALOG))}"
    raise ChaosError(_msg)

SCENARIOS: dict[str, Scenario] = {
    name: Scenario(_RUN[name], info.records, info.summary, info.needs_spark) for name, info in CATALOG.items()
}


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
    unknown = sorted(set(params) - set(accepted) - {"strict", "pipeline", "sink", "sink_url"}) if not has_kwargs else []
    if unknown:
        msg = f"chaos scenario {name!r} takes no parameter {unknown[0]!r}"
        raise ChaosError(msg)
    strict = bool(params.pop("strict", False))
    pipeline = str(params.pop("pipeline", "topology"))
    sink = str(params.pop("sink", None) or "lines")
    sink_url = params.pop("sink_url", None)
    if sink not in SINKS:
        msg = f"chaos sink {sink!r}: expected one of {', '.join(SINKS)}"
        raise ChaosError(msg)
    if sink != "lines" and name in NO_TARGET:
        msg = f"chaos scenario {name!r} checks its own sink (--sink {sink} does not apply); use --sink lines"
        raise ChaosError(msg)
    if pipeline == "dataframe":
        from runtime.chaos import dataframe as chaos_dataframe

        df_run = chaos_dataframe.scenario(name)
        if df_run is None:
            msg = (f"chaos scenario {name!r} has no DataFrame variant; --pipeline dataframe runs "
                   f"{', '.join(chaos_dataframe.names())}")
            raise ChaosError(msg)
        scenario = Scenario(df_run, scenario.records, scenario.summary, scenario.needs_spark)
    elif pipeline != "topology":
        msg = f"chaos pipeline {pipeline!r}: expected 'topology' or 'dataframe'"
        raise ChaosError(msg)
    cfg = config if name in OWN_SERVER else resolved(config)
    path = Path(workdir) if workdir is not None else new_workdir(name)
    path.mkdir(parents=True, exist_ok=True)
    opened = open_target(sink, path, namespace=cfg.namespace,
                         redis_url=cfg.redis_url or resolved(config).redis_url, sink_url=sink_url)
    try:
        ctx = ScenarioContext(name, spark, cfg, path, strict=strict, say=say or (lambda _m: None),
                              target=opened.target)
        report = scenario.run(ctx, records or scenario.records, **params)
    finally:
        opened.close()
        remove_scratch(path)
    report.strict = ctx.strict
    return report

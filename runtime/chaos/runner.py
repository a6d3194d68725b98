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
from runtime.chaos.base import ChaosError, ScenarioContext, new_workdir
from runtime.chaos.targets import SINKS, open_target
from runtime.checker import Report

# scenarios that start (and kill) a Redis server of their own
OWN_SERVER = frozenset({"kill-redis", "long-outage", "kill-primary", "mqtt-ingest-kill", "mqtt-broker-kill",
                        "webhook-keepalive"})
# scenarios whose output is not the chaos rows (the aggregate writes counts)
NO_TARGET = frozenset({"aggregate"})


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


SCENARIOS: dict[str, Scenario] = {
    "fail-rate": Scenario(chaos_scenarios.fail_rate, 3000, "FailRecord in a user function at a rate"),
    "kill-worker": Scenario(chaos_scenarios.kill_worker, 2000, "a Python worker killed mid-partition"),
    "kill-executor": Scenario(chaos_executors.kill_executor, 2000, "an executor JVM SIGKILLed mid-run "
                                                                   "(needs --master 'local-cluster[2,1,1024]')"),
    "batch-fails": Scenario(chaos_scenarios.batch_fails, 3000, "a whole micro-batch fails; the query restarts"),
    "kill-driver": Scenario(chaos_procs.kill_driver, 1500, "the driver SIGKILLed and restarted",
                            needs_spark=False),
    "kill-redis": Scenario(chaos_procs.kill_redis, 3000, "the Redis server SIGKILLed, restarted from its AOF "
                                                         "after 3 s"),
    "long-outage": Scenario(chaos_procs.long_outage, 3000, "the Redis server down for 60 s mid-stream"),
    "kill-ingest": Scenario(chaos_ingest.kill_ingest, 6000, "one of two `ftlayer ingest` processes feeding a "
                            "DataFrame query SIGKILLed mid-file and restarted"),
    "kill-primary": Scenario(chaos_cluster.kill_primary, 3000, "on a Valkey Cluster it starts: the source's "
                             "primary SIGKILLed mid-run, a replica takes over"),
    "webhook-driver-kill": Scenario(chaos_webhook.webhook_driver_kill, 1500, "a webhook-fed driver SIGKILLed under "
                                    "load, restarted on the same port", needs_spark=False),
    "mqtt-driver-kill": Scenario(chaos_mqtt.mqtt_driver_kill, 1500, "an MQTT-fed driver (a real Mosquitto it "
                                 "starts) SIGKILLed under load, restarted with the same client id", needs_spark=False),
    "mqtt-ingest-kill": Scenario(chaos_receivers.mqtt_ingest_kill, 2000, "`ftlayer ingest --mqtt` SIGKILLed "
                                 "mid-stream with messages in hand (a real Mosquitto, a QoS 1 publisher), restarted "
                                 "with the same client id"),
    "mqtt-broker-kill": Scenario(chaos_receivers.mqtt_broker_kill, 1500, "the Mosquitto broker SIGKILLed while "
                                 "`ftlayer ingest --mqtt` holds unpersisted messages, restarted on its data"),
    "webhook-keepalive": Scenario(chaos_receivers.webhook_keepalive, 3000, "`ftlayer ingest --webhook` SIGKILLed "
                                  "with batched requests in flight on keep-alive connections, restarted on the "
                                  "same port"),
    "drop-connections": Scenario(chaos_scenarios.drop_connections, 3000, "CLIENT KILL every 200 ms"),
    "duplicate-flushes": Scenario(chaos_scenarios.duplicate_flushes, 2000, "every flush sent twice"),
    "delayed-acks": Scenario(chaos_scenarios.delayed_acks, 2000, "acks delayed past the timeout"),
    "poison": Scenario(chaos_scenarios.poison, 2000, "a record that always fails"),
    "slow-sink": Scenario(_dataframe_only("slow-sink"), 1200, "DataFrame path: one batch writes for 3 timeouts"),
    "sink-outage": Scenario(_dataframe_only("sink-outage"), 1200, "DataFrame path: the sink refuses every write "
                            "for 5 timeouts"),
    "aggregate": Scenario(_dataframe_only("aggregate"), 2000, "DataFrame path: a stateful groupBy().count() "
                          "through a killed worker and a batch that fails before its commit log entry"),
    "mixed": Scenario(chaos_scenarios.mixed, 3000, "fail-rate + kill-worker + drop-connections + poison "
                                                   "+ duplicate-flushes"),
    "soak": Scenario(chaos_scenarios.soak, 1_000_000, "the mixed faults for a long run (not for CI)"),
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
    report.strict = ctx.strict
    return report

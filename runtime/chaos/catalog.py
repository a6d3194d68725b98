"""The chaos scenarios by name: CI size, one-line summary, whether each needs a SparkSession here.

A table and nothing else: it imports no scenario, no Spark and no topology, so the command line
(:mod:`runtime.cli.chaos`) builds ``ftlayer chaos``'s choices and help from it without loading the
harness. :mod:`runtime.chaos.runner` pairs each name with the function that runs it; a name here
without a function there (or the reverse) fails at import of the runner.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOG", "NO_TARGET", "OWN_SERVER", "ScenarioInfo"]


@dataclass(frozen=True)
class ScenarioInfo:
    """What the command line and the runner know of a scenario before running it."""

    records: int  # CI size: records when the caller gives none
    summary: str
    needs_spark: bool = True  # False: the scenario starts its own driver processes


# scenarios that start (and kill) a Redis server of their own
OWN_SERVER = frozenset({"kill-redis", "long-outage", "kill-primary", "mqtt-ingest-kill", "mqtt-broker-kill",
                        "webhook-keepalive", "webhook-front-kill"})
# scenarios whose output is not the chaos rows (the aggregate writes counts)
NO_TARGET = frozenset({"aggregate"})

CATALOG: dict[str, ScenarioInfo] = {
    "fail-rate": ScenarioInfo(3000, "FailRecord in a user function at a rate"),
    "kill-worker": ScenarioInfo(2000, "a Python worker killed mid-partition"),
    "kill-executor": ScenarioInfo(2000, "an executor JVM SIGKILLed mid-run "
                                        "(needs --master 'local-cluster[2,1,1024]')"),
    "batch-fails": ScenarioInfo(3000, "a whole micro-batch fails; the query restarts"),
    "kill-driver": ScenarioInfo(1500, "the driver SIGKILLed and restarted", needs_spark=False),
    "kill-redis": ScenarioInfo(3000, "the Redis server SIGKILLed, restarted from its AOF after 3 s"),
    "long-outage": ScenarioInfo(3000, "the Redis server down for 60 s mid-stream"),
    "kill-ingest": ScenarioInfo(6000, "one of two `ftlayer ingest` processes feeding a DataFrame query "
                                      "SIGKILLed mid-file and restarted"),
    "kill-primary": ScenarioInfo(3000, "on a Valkey Cluster it starts: the source's primary SIGKILLed mid-run, "
                                       "a replica takes over"),
    "webhook-driver-kill": ScenarioInfo(1500, "a webhook-fed driver SIGKILLed under load, restarted on the same "
                                              "port", needs_spark=False),
    "webhook-driver-front-kill": ScenarioInfo(1500, "the HTTP front process of a webhook-fed driver SIGKILLed under "
                                                    "load; the driver starts a new one and drains", needs_spark=False),
    "mqtt-driver-kill": ScenarioInfo(1500, "an MQTT-fed driver (a real Mosquitto it starts) SIGKILLed under load, "
                                           "restarted with the same client id", needs_spark=False),
    "mqtt-ingest-kill": ScenarioInfo(2000, "`ftlayer ingest --mqtt` SIGKILLed mid-stream with messages in hand "
                                           "(a real Mosquitto, a QoS 1 publisher), restarted with the same client "
                                           "id"),
    "mqtt-broker-kill": ScenarioInfo(1500, "the Mosquitto broker SIGKILLed while `ftlayer ingest --mqtt` holds "
                                           "unpersisted messages, restarted on its data"),
    "webhook-keepalive": ScenarioInfo(3000, "`ftlayer ingest --webhook` SIGKILLed with batched requests in flight "
                                            "on keep-alive connections, restarted on the same port"),
    "webhook-front-kill": ScenarioInfo(3000, "the HTTP front process of `ftlayer ingest --webhook` SIGKILLed with "
                                             "batched requests in flight; ingest starts a new one on the same port"),
    "drop-connections": ScenarioInfo(3000, "CLIENT KILL every 200 ms"),
    "duplicate-flushes": ScenarioInfo(2000, "every flush sent twice"),
    "delayed-acks": ScenarioInfo(2000, "acks delayed past the timeout"),
    "poison": ScenarioInfo(2000, "a record that always fails"),
    "slow-sink": ScenarioInfo(1200, "DataFrame path: one batch writes for 3 timeouts"),
    "sink-outage": ScenarioInfo(1200, "DataFrame path: the sink refuses every write for 5 timeouts"),
    "aggregate": ScenarioInfo(2000, "DataFrame path: a stateful groupBy().count() through a killed worker and a "
                                    "batch that fails before its commit log entry"),
    "mixed": ScenarioInfo(3000, "fail-rate + kill-worker + drop-connections + poison + duplicate-flushes"),
    "soak": ScenarioInfo(1_000_000, "the mixed faults for a long run (not for CI)"),
}

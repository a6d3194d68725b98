"""``ftlayer bench`` and ``scripts/bench``: run the benchmarks, print a JSON summary, keep it in results.json.

Every benchmark measures its variants side by side in one run (alternating,
repeated) and reports medians with their spread:

- ``acker``: XOR updates through the AckerTable vs raw pipelined Redis writes,
  and Redis bytes per pending record (:mod:`runtime.bench.acker`).
- ``redis-cpu``: the server's CPU per record in each phase of its life (persist,
  read, ack, trim), no Spark (:mod:`runtime.bench.redis_cpu`).
- ``ingest-cpu``: the driver's CPU per record ingested, from a source's records to persisted
  in Redis (the server's CPU excluded), no Spark (:mod:`runtime.bench.ingest_cpu`).
- ``scaling``: persist, acker and drain throughput and Redis memory at 10k,
  100k and 1M pending records, plotted as PNG files next to the JSON
  (:mod:`runtime.bench.scaling`, :mod:`runtime.bench.plot`).
- ``replay``: kill one Python worker during a batch; records processed again
  vs records the fault lost, and what Spark's batch recovery re-runs
  (:mod:`runtime.bench.replay`).
- ``retry``: the same kill on ``local[2,4]``, where Spark retries the task: what
  the retry writes again and the sink duplicates, ftlayer next to plain
  Structured Streaming (:mod:`runtime.bench.retry`).
- ``latency``: complete latency (persist to ack) under steady load at a fixed
  trigger interval (:mod:`runtime.bench.latency`).
- ``cluster``: persist + ack throughput of 2 client processes on a 1-primary and a
  3-primary Valkey Cluster, alternating; ``cluster_scaling_ratio``
  (:mod:`runtime.bench.cluster`).
- ``effectively-once``: the DataFrame pipeline into Postgres and into Delta, an at-least-once
  writer vs the effectively-once sink of the same kind; ``effectively_once_vs_at_least_once_ratio``
  (Postgres; ``..._delta`` for Delta) (:mod:`runtime.bench.effectively_once`).
- ``masters``: FT-on end-to-end throughput on ``local[2]`` and on
  ``local-cluster[2,1,1024]`` (two executor JVMs), each run in its own process
  (:mod:`runtime.bench.masters`).
- ``webhook`` and ``mqtt``: records/s through ftlayer's receivers (persisting into Redis before
  confirming) next to the same aiohttp server confirming at once and a plain QoS 1 subscriber of the
  same Mosquitto; ``webhook_vs_raw_ratio``, ``mqtt_vs_raw_ratio`` (:mod:`runtime.bench.receivers`).
- ``e2e``: FT on vs FT off vs hand-written Structured Streaming on the same
  topology and input, small records and 1 KiB payloads (:mod:`runtime.bench.e2e`), and the
  same for a DataFrame pipeline (:mod:`runtime.bench.e2e_dataframe`); beside each variant's
  records/s, the whole machine's CPU per record over the same span (``cpu_us_per_record``, from
  ``/proc/stat``): on a machine these jobs keep busy, a ratio of rates follows the ratio of CPU.

The summary is merged into ``<out>/results.json`` (``--out``, default ``./ftlayer-bench`` in the
current directory; ``scripts/bench`` passes the checkout's ``docs/bench``), so
running one benchmark keeps the others' figures; the headline keys are
``ft_on_vs_off_ratio``, ``ft_on_vs_plain_ratio`` (and ``ft_on_vs_plain_frozen_ratio``: against plain PySpark
with ftlayer's worker-heap freeze), ``redis_cpu_us_per_record``, ``ingest_us_per_record``, ``acker_vs_raw_ratio``,
``complete_latency_p99_over_trigger`` (next to ``plain_latency_p99_over_trigger``, plain Structured
Streaming under the same load and trigger), ``replay_precision`` and
``bytes_per_pending_record``, plus the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.cli.env import add_env_options, resolve_env_defaults

BENCHES = ("acker", "redis-cpu", "ingest-cpu", "scaling", "replay", "retry", "latency", "e2e", "e2e-dataframe",
           "effectively-once", "cluster", "masters", "webhook", "mqtt")
DESCRIPTION = (
    "Run the benchmarks, print a JSON summary and merge it into results.json. Each benchmark measures its "
    "variants side by side in one run (alternating, repeated) and reports medians with their spread: "
    "acker (XOR updates vs raw Redis writes, bytes per pending record), redis-cpu (server CPU per record "
    "by phase), ingest-cpu (the driver's CPU per record from a source's records to persisted: ingest_us_per_record), "
    "scaling (throughput and memory at "
    "10k/100k/1M pending), replay (records processed again after a killed worker), retry (what a task "
    "retry on local[2,4] writes again and the sink duplicates it leaves, ftlayer vs plain Spark), latency "
    "(persist to ack at a fixed trigger), e2e (FT on vs FT off vs plain Structured Streaming, Topology and "
    "DataFrame pipelines; e2e-dataframe: the DataFrame pipeline alone), cluster (persist+ack throughput of "
    "2 client processes on a 1-primary vs a 3-primary Valkey Cluster: cluster_scaling_ratio), effectively-once "
    "(the DataFrame pipeline into Postgres and into Delta, an at-least-once writer vs ftlayer's effectively-once "
    "sink: effectively_once_vs_at_least_once_ratio), masters "
    "(FT-on e2e throughput on local[2] vs local-cluster[2,1,1024], each in its own process), webhook (records/s "
    "through the webhook receiver persisting into Redis vs the same aiohttp server confirming at once, keep-alive "
    "batched clients: webhook_vs_raw_ratio), mqtt (records/s through the MQTT source persisting into Redis vs a plain "
    "QoS 1 subscriber of the same Mosquitto: mqtt_vs_raw_ratio). Results go to --out (default ./ftlayer-bench in "
    "the current directory)."
)


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s.replace("_", "")) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        msg = f"invalid --scaling-sizes {text!r}: expected comma-separated integers such as 10000,100000"
        raise ConfigError(msg) from exc
    return sizes


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``ftlayer bench`` (each names its environment variable)."""
    p.add_argument("which", nargs="*", default=None, metavar="BENCH",
                   help=f"benchmarks to run: {', '.join(BENCHES)} or all (default all, about 15 minutes on "
                        "2 cores) [env FTLAYER_BENCH, comma-separated]")
    p.add_argument("--redis-url", default=None, metavar="URL",
                   help="Redis to measure; default an embedded valkey-server [env FTLAYER_REDIS_URL]")
    add_env_options(p, "bench")


def _say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _runs_line(runs: dict[str, Any]) -> str:
    """One e2e round: each variant's records/s and, where measured, the machine's CPU per record."""
    return ", ".join(f"{name} {run.rate:,.0f}/s" + ("" if run.cpu_us_per_record is None
                                                     else f" ({run.cpu_us_per_record:.1f} us CPU/record)")
                     for name, run in runs.items())


def _selected(args: argparse.Namespace) -> list[str]:
    names = list(args.which or []) or [s for s in _env("FTLAYER_BENCH", "all").split(",") if s]
    if "all" in names:
        return list(BENCHES)
    unknown = sorted(set(names) - set(BENCHES))
    if unknown:
        msg = f"unknown benchmark(s) {unknown}: choose from {', '.join(BENCHES)} or all"
        raise ConfigError(msg)
    return [b for b in BENCHES if b in names]


def _on_spark(url: str, selected: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """latency, e2e and effectively-once share one local SparkSession."""
    from runtime.bench.e2e import bench_e2e
    from runtime.bench.latency import bench_latency
    from runtime.bench.latency_plain import plain_latency
    from runtime.spark.session import local_session

    spark = local_session("ftlayer-bench", log_level="ERROR")
    cfg = FTConfig(redis_url=url, max_pending=50_000, timeout_s=120.0)
    summary: dict[str, Any] = {}
    if "latency" in selected:
        lat = bench_latency(spark, cfg, rate_per_s=args.latency_rate, duration_s=args.latency_duration_s,
                            trigger_interval_s=args.trigger_interval_s, progress=_say)
        summary["complete_latency_p99_over_trigger"] = lat["p99_over_trigger"]
        _say("latency, plain Structured Streaming (no ftlayer), the same load and trigger")
        plain = plain_latency(spark, url, rate_per_s=args.latency_rate, duration_s=args.latency_duration_s,
                              trigger_interval_s=args.trigger_interval_s)
        _say(f"  plain: p50 {plain['p50_ms']:.0f} ms, p99 {plain['p99_ms']:.0f} ms; ftlayer: p50 "
             f"{lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms")
        lat["plain"] = plain
        summary["plain_latency_p99_over_trigger"] = plain["p99_over_trigger"]
        summary["latency"] = lat
    if "e2e" in selected:
        for label, payload, records in (("e2e_small", 0, args.e2e_records), ("e2e_1kib", 1024, args.e2e_kib_records)):
            _say(f"{label}: {records:,} records, {args.e2e_repeats} alternating rounds of ft-on / ft-off / plain / "
                 "plain-frozen")
            summary[label] = bench_e2e(
                spark, cfg, records, payload, args.e2e_repeats,
                on_round=lambda r, runs: _say(f"  round {r + 1}: {_runs_line(runs)}"))
        summary["ft_on_vs_off_ratio"] = round(summary["e2e_small"]["ft_on_vs_off_ratio"]["median"], 3)
        summary["ft_on_vs_plain_ratio"] = round(summary["e2e_small"]["ft_on_vs_plain_ratio"]["median"], 3)
        summary["ft_on_vs_plain_frozen_ratio"] = round(
            summary["e2e_small"]["ft_on_vs_plain_frozen_ratio"]["median"], 3)
    if "e2e" in selected or "e2e-dataframe" in selected:
        from runtime.bench.e2e_dataframe import bench_e2e_dataframe

        records = args.e2e_dataframe_records
        _say(f"e2e_dataframe: {records:,} records, {args.e2e_repeats} alternating rounds of ft-on / "
             "ft-on-columnar / ft-off / plain / python-source")
        summary["e2e_dataframe"] = bench_e2e_dataframe(
            spark, cfg, records, args.e2e_repeats,
            on_round=lambda r, runs: _say(f"  round {r + 1}: {_runs_line(runs)}"))
        summary["ft_on_vs_plain_ratio_dataframe"] = round(
            summary["e2e_dataframe"]["ft_on_vs_plain_ratio"]["median"], 3)
        summary["ft_on_columnar_vs_plain_ratio_dataframe"] = round(
            summary["e2e_dataframe"]["ft_on_columnar_vs_plain_ratio"]["median"], 3)
    if "effectively-once" in selected:
        from runtime.bench.effectively_once import bench_effectively_once

        _say(f"effectively-once: {args.once_records:,} records, {args.once_repeats} alternating rounds of an "
             "at-least-once writer and the effectively-once sink, into Postgres and into Delta")
        once = bench_effectively_once(
            spark, cfg, args.once_records, args.once_repeats, postgres_url=args.postgres_url,
            on_round=lambda kind, r, got: _say(f"  {kind} round {r + 1}: " + ", ".join(
                f"{k} {v:,.0f}/s" for k, v in got.items())))
        summary["effectively_once"] = once
        summary["effectively_once_vs_at_least_once_ratio"] = round(
            once["postgres"]["effectively_once_vs_at_least_once_ratio"]["median"], 3)
        summary["effectively_once_vs_at_least_once_ratio_delta"] = round(
            once["delta"]["effectively_once_vs_at_least_once_ratio"]["median"], 3)
    return summary


def _receivers(url: str, selected: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """webhook and mqtt: ftlayer's receivers vs the raw server or broker, alternating rounds."""
    from runtime.bench.receivers import bench_mqtt, bench_webhook

    summary: dict[str, Any] = {}
    if "webhook" in selected:
        _say(f"webhook: {args.webhook_records:,} records per round in batches of {args.webhook_batch} on "
             f"{args.webhook_connections} keep-alive connections, {args.receiver_repeats} alternating rounds of raw "
             "aiohttp / ftlayer's receiver")
        hook = bench_webhook(url, args.webhook_records, args.webhook_batch, args.webhook_connections,
                             args.receiver_repeats, progress=_say)
        summary["webhook"] = hook
        summary["webhook_vs_raw_ratio"] = round(hook["webhook_vs_raw_ratio"]["median"], 3)
    if "mqtt" in selected:
        _say(f"mqtt: {args.mqtt_records:,} QoS 1 messages per round, {args.receiver_repeats} alternating rounds of a "
             "plain subscriber / ftlayer's MQTT source")
        mqtt = bench_mqtt(url, args.mqtt_records, args.receiver_repeats, progress=_say)
        summary["mqtt"] = mqtt
        summary["mqtt_vs_raw_ratio"] = round(mqtt["mqtt_vs_raw_ratio"]["median"], 3)
    return summary


def run(args: argparse.Namespace) -> int:
    """Run the selected benchmarks; print the JSON summary; merge it into results.json unless --no-write."""
    # imported here, not at the top: every other command of the CLI starts without the benchmarks
    from ftlayer.servers.embedded import EmbeddedServer
    from runtime.bench.acker import bench_acker, bench_memory, write_results

    selected = _selected(args)
    out = Path(args.out).resolve()
    if not args.no_write:
        try:  # before any benchmark: a bad --out fails in a second, not at the end
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from runtime.cli.common import CLIError

            msg = f"--out {args.out} must be a directory (results.json is written into it): {exc.strerror}"
            raise CLIError(msg) from exc
        _say(f"results go to {out / 'results.json'} (--out)")
    given = args.redis_url or _env("FTLAYER_REDIS_URL", "")
    server = None if given else EmbeddedServer().start()
    url = given or (server.url if server else "")
    summary: dict[str, Any] = {}
    try:
        if "acker" in selected:
            batch = FTConfig().flush_batch_size
            _say(f"acker vs raw: {2 * args.records:,} updates per round, {args.repeats} rounds each, alternating")
            acker = bench_acker(url, args.records, args.repeats, batch)
            _say(f"memory: {args.records:,} pending records")
            memory = bench_memory(url, args.records, args.payload_bytes)
            summary.update({
                "acker_vs_raw_ratio": round(acker["ratio"]["median"], 3),
                "bytes_per_pending_record": round(memory["bytes_per_pending_record"], 1),
                "acker": acker,
                "memory": memory,
            })
        if "redis-cpu" in selected:
            from runtime.bench.redis_cpu import bench_redis_cpu

            _say(f"redis-cpu: server CPU per record by phase, {args.records * 2:,} records, {args.repeats} rounds")
            cpu = bench_redis_cpu(url, args.records * 2, args.repeats, progress=_say)
            summary["redis_cpu"] = cpu
            summary["redis_cpu_us_per_record"] = round(cpu["us_per_record"]["total"]["median"], 2)
        if "ingest-cpu" in selected:
            from runtime.bench.ingest_cpu import bench_ingest_cpu

            _say(f"ingest-cpu: driver CPU per record ingested, {args.records * 2:,} records, {args.repeats} "
                 "alternating rounds of an iterable, a poll source and the iterable with its schema checked")
            ingest = bench_ingest_cpu(url, args.records * 2, args.repeats, progress=_say)
            summary["ingest_cpu"] = ingest
            summary["ingest_us_per_record"] = round(ingest["us_per_record"]["iterable"]["median"], 2)
            summary["ingest_us_per_record_schema"] = round(ingest["us_per_record"]["schema"]["median"], 2)
        if "scaling" in selected:
            from runtime.bench.plot import plot_scaling
            from runtime.bench.scaling import bench_scaling

            scaling = bench_scaling(url, _sizes(args.scaling_sizes), payload_bytes=args.payload_bytes)
            summary["scaling"] = scaling
            if not args.no_write:
                pngs = plot_scaling(scaling, out)
                scaling["plots"] = [p.name for p in pngs]
                _say("wrote " + ", ".join(str(p) for p in pngs))
        if "replay" in selected:
            from runtime.bench.replay import bench_replay

            replay = bench_replay(url, records=args.replay_records, repeats=args.replay_repeats, progress=_say)
            summary["replay_precision"] = round(replay["replay_precision"], 3)
            summary["replay"] = replay
        if "retry" in selected:
            from runtime.bench.retry import bench_retry

            retry = bench_retry(url, records=args.replay_records, repeats=args.replay_repeats, progress=_say)
            summary["task_retry"] = retry
            summary["retry_duplicates_vs_spark"] = round(retry["retry_duplicates_vs_spark"]["median"], 3)
        if "cluster" in selected:
            from runtime.bench.cluster import bench_cluster_scaling

            _say(f"cluster: 2 clients x {args.cluster_records:,} records into one source of 16 shards, "
                 f"{args.cluster_repeats} alternating rounds on 1 and 3 primaries")
            cluster = bench_cluster_scaling(args.cluster_records, args.cluster_repeats, progress=_say)
            summary["cluster"] = cluster
            summary["cluster_scaling_ratio"] = round(cluster["ratio"]["median"], 3)
            summary["cluster_primary_capacity_ratio"] = round(cluster["primary_capacity_ratio"]["median"], 3)
        if "masters" in selected:
            from runtime.bench.masters import bench_masters

            _say(f"masters: FT-on e2e, {args.masters_records:,} records, {args.masters_repeats} alternating rounds "
                 f"on local[2] and local-cluster[2,1,1024]")
            masters = bench_masters(url, args.masters_records, args.masters_repeats, progress=_say)
            summary["e2e_masters"] = masters
            summary["local_cluster_vs_local_ratio"] = round(masters["local_cluster_vs_local_ratio"]["median"], 3)
        if "webhook" in selected or "mqtt" in selected:
            summary.update(_receivers(url, selected, args))
        if {"latency", "e2e", "e2e-dataframe", "effectively-once"} & set(selected):
            summary.update(_on_spark(url, selected, args))
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(summary, indent=2, default=str))
    if not args.no_write:
        write_results(summary, out / "results.json")
        _say(f"wrote {out / 'results.json'}")
    return 0


def add_parser(sub: Any) -> None:
    """Add ``ftlayer bench`` to the CLI's subparsers."""
    p = sub.add_parser("bench", help="run the benchmarks (FT cost, acker, latency, replay precision, memory, scaling)",
                       description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runtime.cli.bench`` (what ``scripts/bench`` runs)."""
    from runtime.cli.common import CLIError

    parser = argparse.ArgumentParser(prog="ftlayer bench", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(resolve_env_defaults(args))
    except (CLIError, ConfigError) as exc:
        print(f"ftlayer bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

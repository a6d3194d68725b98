"""``ftlayer bench`` and ``scripts/bench``: run the benchmarks, print a JSON summary, keep it in results.json.

Every benchmark measures its variants side by side in one run (alternating,
repeated) and reports medians with their spread:

- ``acker``: XOR updates through the AckerTable vs raw pipelined Redis writes,
  and Redis bytes per pending record (:mod:`runtime.bench.acker`).
- ``scaling``: persist, acker and drain throughput and Redis memory at 10k,
  100k and 1M pending records, plotted as PNG files next to the JSON
  (:mod:`runtime.bench.scaling`, :mod:`runtime.bench.plot`).
- ``replay``: kill one Python worker during a batch; records processed again
  vs records the fault lost, and what Spark's batch recovery re-runs
  (:mod:`runtime.bench.replay`).
- ``latency``: complete latency (persist to ack) under steady load at a fixed
  trigger interval (:mod:`runtime.bench.latency`).
- ``e2e``: FT on vs FT off vs hand-written Structured Streaming on the same
  topology and input, small records and 1 KiB payloads (:mod:`runtime.bench.e2e`).

The summary is merged into ``<out>/results.json`` (default ``docs/bench``), so
running one benchmark keeps the others' figures; the headline keys are
``ft_on_vs_off_ratio``, ``acker_vs_raw_ratio``,
``complete_latency_p99_over_trigger``, ``replay_precision`` and
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
from runtime.bench.acker import RESULTS, bench_acker, bench_memory, write_results

BENCHES = ("acker", "scaling", "replay", "latency", "e2e")


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
                   help=f"benchmarks to run: {', '.join(BENCHES)} or all (default all, about 25 minutes on "
                        "2 cores) [env FTLAYER_BENCH, comma-separated]")
    p.add_argument("--redis-url", default=_env("FTLAYER_REDIS_URL", ""),
                   help="Redis to measure; default an embedded valkey-server [env FTLAYER_REDIS_URL]")
    p.add_argument("--out", default=_env("FTLAYER_BENCH_OUT", str(RESULTS.parent)), metavar="DIR",
                   help="directory of results.json and the PNG plots [env FTLAYER_BENCH_OUT]")
    p.add_argument("--no-write", action="store_true", default=_env("FTLAYER_BENCH_NO_WRITE", "") == "1",
                   help="print only; leave results.json and the plots alone [env FTLAYER_BENCH_NO_WRITE=1]")
    p.add_argument("--records", type=int, default=int(_env("FTLAYER_BENCH_RECORDS", "100000")),
                   help="acker: records per round and pending records of the memory figure "
                        "[env FTLAYER_BENCH_RECORDS]")
    p.add_argument("--repeats", type=int, default=int(_env("FTLAYER_BENCH_REPEATS", "5")),
                   help="acker: alternating rounds per variant [env FTLAYER_BENCH_REPEATS]")
    p.add_argument("--payload-bytes", type=int, default=int(_env("FTLAYER_BENCH_PAYLOAD_BYTES", "32")),
                   help="acker and scaling: payload size of the memory figures [env FTLAYER_BENCH_PAYLOAD_BYTES]")
    p.add_argument("--scaling-sizes", default=_env("FTLAYER_BENCH_SCALING_SIZES", "10000,100000,1000000"),
                   help="scaling: pending-record levels [env FTLAYER_BENCH_SCALING_SIZES]")
    p.add_argument("--replay-records", type=int, default=int(_env("FTLAYER_BENCH_REPLAY_RECORDS", "20000")),
                   help="replay: records in the failed batch [env FTLAYER_BENCH_REPLAY_RECORDS]")
    p.add_argument("--replay-repeats", type=int, default=int(_env("FTLAYER_BENCH_REPLAY_REPEATS", "3")),
                   help="replay: rounds [env FTLAYER_BENCH_REPLAY_REPEATS]")
    p.add_argument("--latency-rate", type=float, default=float(_env("FTLAYER_BENCH_LATENCY_RATE", "2000")),
                   help="latency: offered records per second [env FTLAYER_BENCH_LATENCY_RATE]")
    p.add_argument("--latency-duration-s", type=float,
                   default=float(_env("FTLAYER_BENCH_LATENCY_DURATION_S", "30")),
                   help="latency: measured seconds after the warm-up [env FTLAYER_BENCH_LATENCY_DURATION_S]")
    p.add_argument("--trigger-interval-s", type=float,
                   default=float(_env("FTLAYER_BENCH_TRIGGER_INTERVAL_S", "1.0")),
                   help="latency: the fixed trigger interval [env FTLAYER_BENCH_TRIGGER_INTERVAL_S]")
    p.add_argument("--e2e-records", type=int, default=int(_env("FTLAYER_BENCH_E2E_RECORDS", "1000000")),
                   help="e2e: small records per run [env FTLAYER_BENCH_E2E_RECORDS]")
    p.add_argument("--e2e-kib-records", type=int, default=int(_env("FTLAYER_BENCH_E2E_KIB_RECORDS", "200000")),
                   help="e2e: 1 KiB records per run [env FTLAYER_BENCH_E2E_KIB_RECORDS]")
    p.add_argument("--e2e-repeats", type=int, default=int(_env("FTLAYER_BENCH_E2E_REPEATS", "3")),
                   help="e2e: alternating rounds per variant [env FTLAYER_BENCH_E2E_REPEATS]")


def _say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


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
    """latency and e2e share one local SparkSession."""
    from runtime.bench.e2e import bench_e2e
    from runtime.bench.latency import bench_latency
    from runtime.spark.session import local_session

    spark = local_session("ftlayer-bench")
    cfg = FTConfig(redis_url=url, max_pending=50_000, timeout_s=120.0)
    summary: dict[str, Any] = {}
    if "latency" in selected:
        lat = bench_latency(spark, cfg, rate_per_s=args.latency_rate, duration_s=args.latency_duration_s,
                            trigger_interval_s=args.trigger_interval_s, progress=_say)
        summary["complete_latency_p99_over_trigger"] = lat["p99_over_trigger"]
        summary["latency"] = lat
    if "e2e" in selected:
        for label, payload, records in (("e2e_small", 0, args.e2e_records), ("e2e_1kib", 1024, args.e2e_kib_records)):
            _say(f"{label}: {records:,} records, {args.e2e_repeats} alternating rounds of ft-on / ft-off / plain")
            summary[label] = bench_e2e(
                spark, cfg, records, payload, args.e2e_repeats,
                on_round=lambda r, got: _say(f"  round {r + 1}: " + ", ".join(
                    f"{k} {v:,.0f}/s" for k, v in got.items())))
        summary["ft_on_vs_off_ratio"] = round(summary["e2e_small"]["ft_on_vs_off_ratio"]["median"], 3)
    return summary


def run(args: argparse.Namespace) -> int:
    """Run the selected benchmarks; print the JSON summary; merge it into results.json unless --no-write."""
    from ftlayer.server import EmbeddedServer

    selected = _selected(args)
    out = Path(args.out)
    server = None if args.redis_url else EmbeddedServer().start()
    url = args.redis_url or (server.url if server else "")
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
        if "latency" in selected or "e2e" in selected:
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
                       description=(__doc__ or "").split("\n\n")[0])
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runtime.cli.bench`` (what ``scripts/bench`` runs)."""
    parser = argparse.ArgumentParser(prog="ftlayer bench", description=(__doc__ or "").split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""Does a plain-Spark run depend on what ran before it? ``python -m runtime.bench.order [N] [SEQ]``.

The e2e bench rotates its four variants, so in a run of three rounds ``plain`` always runs right
before ``plain-frozen``; with 1 KiB records plain-frozen came out below plain in such runs. This
runs the bench's plain job (:func:`runtime.bench.e2e.run_plain`, 1 KiB records, ``N`` per run,
default 200,000) in the order ``SEQ`` gives (``P`` plain, ``F`` plain-frozen; default
``PPPPFFFFPPPPFFFFPFPFPFPFPF``) in one session after the bench's warm-up, and prints each run's
rate and, per (variant, the variant before it), the median, min and max. The first run is not
counted (nothing ran before it). Run it alone on the machine (``flock`` the Spark lock).
"""

from __future__ import annotations

import statistics
import sys

from runtime.bench.e2e import run_plain
from runtime.spark.session import local_session

PAYLOAD_BYTES = 1024


def main(argv: list[str]) -> int:
    records = int(argv[0]) if argv else 200_000
    seq = argv[1] if len(argv) > 1 else "PPPPFFFFPPPPFFFFPFPFPFPFPF"
    if set(seq) - {"P", "F"}:
        print(f"SEQ is made of P (plain) and F (plain-frozen), got {seq!r}", file=sys.stderr)
        return 2
    spark = local_session("ftlayer-bench-order", log_level="ERROR")
    run_plain(spark, 50_000, PAYLOAD_BYTES)  # the e2e bench's warm-up of both
    run_plain(spark, 50_000, PAYLOAD_BYTES, frozen=True)
    by_pair: dict[tuple[str, str], list[float]] = {}
    before = ""
    for variant in seq:
        rate = run_plain(spark, records, PAYLOAD_BYTES, frozen=variant == "F").rate
        print(f"{variant} after {before or '-'}: {rate:,.0f} rec/s", flush=True)
        if before:
            by_pair.setdefault((variant, before), []).append(rate)
        before = variant
    for (variant, prev), rates in sorted(by_pair.items()):
        print(f"{variant} after {prev}: median {statistics.median(rates):,.0f} "
              f"({min(rates):,.0f}-{max(rates):,.0f}), {len(rates)} runs")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The ``ftlayer`` command line. Every option's help names its environment variable."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ftlayer.errors import FTLayerError
from runtime.cli import bench as bench_cli
from runtime.cli import chaos, dlq, status


def _cmd_redis(args: argparse.Namespace) -> int:
    from ftlayer.server import run_foreground

    if args.cluster:
        return _cmd_redis_cluster(args)
    return run_foreground(data_dir=args.data_dir, port=args.port)


def _cmd_redis_cluster(args: argparse.Namespace) -> int:
    from ftlayer.cluster_server import run_cluster_foreground
    from runtime.cli.common import CLIError

    if args.port is not None:
        msg = "--port cannot be used with --cluster: every node takes a free port, and all are printed"
        raise CLIError(msg)
    return run_cluster_foreground(data_dir=args.data_dir)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; subcommands are added by the modules that implement them."""
    parser = argparse.ArgumentParser(
        prog="ftlayer",
        description="Record-level at-least-once processing for PySpark Structured Streaming.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_redis = sub.add_parser("redis", help="run the embedded valkey-server in the foreground")
    p_redis.add_argument(
        "--data-dir", default=None,
        help="data directory (AOF lives here); default a temporary directory "
             "[env FTLAYER_EMBEDDED_DATA_DIR]",
    )
    p_redis.add_argument("--port", type=int, default=None, help="port; default a free one")
    p_redis.add_argument(
        "--cluster", action="store_true",
        help="run a test Valkey Cluster instead (preview): 3 primaries with 1 replica each, free ports; "
             "ftlayer's scripts do not run on it yet",
    )
    p_redis.set_defaults(func=_cmd_redis)
    status.add_parser(sub)
    dlq.add_parser(sub)
    chaos.add_parser(sub)
    bench_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ftlayer`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FTLayerError as exc:
        print(f"ftlayer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

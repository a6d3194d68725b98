"""The ``ftlayer`` command line. Every option's help names its environment variable.

Contract: no command prints a Python traceback for a bad option, a bad environment variable, an
unreachable or misconfigured server, a file it cannot write: each ends with one
``ftlayer: error: ...`` line (or the subcommand's usage for a bad option) and exit status 2.
Ctrl-C ends a command with one line and status 130; a closed standard output (``| head``) ends it
quietly with status 141. Unknown ``FTLAYER_*`` variables are reported on stderr with the closest
known name, and otherwise ignored. The connection options (``--redis-url``, ``--namespace``,
``--config``) may come before or after the command; after wins. ``python -m ftlayer`` is the same
command line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

import redis

from ftlayer import __version__
from ftlayer.errors import FTLayerError
from runtime.cli import bench as bench_cli
from runtime.cli import chaos, dlq, doctor, ingest, sources, status
from runtime.cli import config as config_cli
from runtime.cli.common import add_connection_options, merge_connection_options
from runtime.cli.env import add_env_options, env_help_epilog, resolve_env_defaults, unknown_env_warnings


def _cmd_redis(args: argparse.Namespace) -> int:
    from ftlayer.config import FTConfig
    from runtime.cli.redis_servers import run_foreground

    if args.cluster:
        return _cmd_redis_cluster(args)
    # --data-dir, else FTLAYER_EMBEDDED_DATA_DIR / embedded_data_dir of the config file (--config)
    data_dir = args.data_dir or FTConfig.load(args.config).embedded_data_dir or None
    return run_foreground(data_dir=data_dir, port=args.port)


def _set_leaf_parsers(parser: argparse.ArgumentParser) -> None:
    """Remember on each (sub)command parser itself, so a bad option is reported with that command's usage."""
    parser.set_defaults(cli_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _set_leaf_parsers(sub)


def _cmd_redis_cluster(args: argparse.Namespace) -> int:
    from runtime.cli.common import CLIError
    from runtime.cli.redis_servers import run_cluster_foreground

    if args.port is not None:
        msg = "--port cannot be used with --cluster: every node takes a free port, and all are printed"
        raise CLIError(msg)
    if args.config is not None:
        msg = "--config cannot be used with --cluster: the nodes' data directories come from --data-dir only"
        raise CLIError(msg)
    return run_cluster_foreground(data_dir=args.data_dir)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; subcommands are added by the modules that implement them."""
    parser = argparse.ArgumentParser(
        prog="ftlayer",
        description="Record-level at-least-once processing for PySpark Structured Streaming.",
        epilog=env_help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ftlayer {__version__}")
    add_connection_options(parser, before_command=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p_redis = sub.add_parser(
        "redis", help="run the embedded valkey-server in the foreground",
        description="Run the embedded valkey-server in the foreground until Ctrl-C or SIGTERM; print its URL.",
    )
    add_env_options(p_redis, "redis")
    p_redis.add_argument("--port", type=int, default=None, help="port; default a free one")
    p_redis.add_argument(
        "--config", default=None, metavar="PATH",
        help="ftlayer TOML config file whose embedded_data_dir is the data directory when --data-dir is not "
             "given; default ./ftlayer.toml if it exists [env FTLAYER_CONFIG]",
    )
    p_redis.add_argument(
        "--cluster", action="store_true",
        help="run a test Valkey Cluster instead: 3 primaries with 1 replica each on free ports, AOF on; "
             "prints every node's URL: point redis_url at any of them",
    )
    p_redis.set_defaults(func=_cmd_redis)
    status.add_parser(sub)
    dlq.add_parser(sub)
    sources.add_parser(sub)
    doctor.add_parser(sub)
    config_cli.add_parser(sub)
    ingest.add_parser(sub)
    chaos.add_parser(sub)
    bench_cli.add_parser(sub)
    _set_leaf_parsers(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ftlayer`` console script."""
    for warning in unknown_env_warnings():
        print(f"ftlayer: warning: {warning}", file=sys.stderr)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    more = getattr(args, "trailing_positionals", None)  # e.g. ingest's FILEs given after its options
    if extra and more and all(e == "-" or not e.startswith("-") for e in extra):
        getattr(args, more).extend(extra)
        extra = []
    if extra:
        args.cli_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    merge_connection_options(args, args.cli_parser)
    try:
        return int(args.func(resolve_env_defaults(args)))
    except FTLayerError as exc:
        return _error(str(exc))
    except redis.RedisError as exc:  # the commands name the (masked) URL; this is the last resort
        return _error(f"Redis: {exc}")
    except BrokenPipeError:
        # the reader went away (ftlayer dlq list | head): no traceback, and none at exit either
        with contextlib.suppress(OSError, ValueError):  # stdout no file (captured): nothing flushes into a pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # a file or directory the command cannot read or write
        return _error(str(exc))
    except KeyboardInterrupt:
        print("ftlayer: interrupted", file=sys.stderr)
        return 130


def _error(message: str) -> int:
    """The one line every failed command ends with; exit status 2."""
    print(f"ftlayer: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

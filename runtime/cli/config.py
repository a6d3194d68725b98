"""``ftlayer config``: the effective configuration and where each value came from.

Contract: it resolves the config exactly as a job would (defaults < the TOML file <
``FTLAYER_*`` env < ``spark.ftlayer.*`` Spark conf), with ``--conf KEY=VALUE`` standing for the Spark
conf a job would get (``spark-submit --conf``), and ``--redis-url`` / ``--namespace`` winning as
"command line". It prints one row per option: name, value, origin (``default``, ``file PATH``,
``env NAME``, ``Spark conf KEY`` or ``command line``). The Redis URL's password is masked. It never
connects to anything. A bad value fails like the job would, naming where it came from (exit 2).
``-o json`` (or ``--json``) prints ``{"version": 1, "config_file": ..., "options": {name: {"value", "origin"}}}``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ftlayer.config import SPARK_PREFIX, FTConfig, mask_url
from ftlayer.config.sources import config_file_path
from runtime.cli.common import CLIError, add_output_option, connection_options, render_table

JSON_VERSION = 1


def _spark_conf(pairs: list[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith(SPARK_PREFIX):
            msg = f"--conf {pair!r}: expected {SPARK_PREFIX}OPTION=VALUE"
            raise CLIError(msg)
        conf[key.strip()] = value
    return conf


def explain(args: argparse.Namespace) -> tuple[FTConfig, dict[str, str]]:
    """The effective config and each option's origin, for these command-line arguments."""
    overrides: dict[str, Any] = {}
    if args.redis_url is not None:
        overrides["redis_url"] = args.redis_url
    if args.namespace is not None:
        overrides["namespace"] = args.namespace
    return FTConfig.explain(args.config, env=os.environ, spark_conf=_spark_conf(args.conf),
                            overrides_origin="command line", **overrides)


def _shown(name: str, value: Any) -> str:
    if name == "redis_url":
        return mask_url(value) if value else "(empty: an embedded server is started)"
    return repr(value) if isinstance(value, str) else str(value)


def run_config(args: argparse.Namespace) -> int:
    """The ``config`` command (see the module contract). Returns the exit code."""
    config, origins = explain(args)
    path = config_file_path(args.config, os.environ)
    if args.output == "json":
        doc = {
            "version": JSON_VERSION,
            "config_file": str(path) if path is not None else None,
            "options": {
                name: {"value": mask_url(v) if name == "redis_url" else v, "origin": origins[name]}
                for name, v in ((n, getattr(config, n)) for n in origins)
            },
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(f"config file: {path if path is not None else 'none (no --config, $FTLAYER_CONFIG or ./ftlayer.toml)'}")
    rows = [[name, _shown(name, getattr(config, name)), origins[name]] for name in origins]
    print(render_table(["OPTION", "VALUE", "FROM"], rows, align="lll"))
    return 0


def add_parser(sub: Any) -> None:
    """Add the ``config`` subcommand to the CLI's subparsers."""
    p = sub.add_parser(
        "config", parents=[connection_options()],
        help="print the effective config and where each value came from",
        description="Print the effective ftlayer config and where each value came from: default, the TOML "
                    "file, an FTLAYER_* environment variable, Spark conf (--conf) or the command line. "
                    "Connects to nothing.",
    )
    p.add_argument("--conf", action="append", default=[], metavar="spark.ftlayer.OPTION=VALUE",
                   help="Spark conf as a job would get it from spark-submit --conf (repeatable)")
    add_output_option(p)
    p.set_defaults(func=run_config)

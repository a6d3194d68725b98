"""``ftlayer doctor``: check the server and the Spark side before a job runs.

Contract: it runs the checks of :mod:`runtime.cli.doctor_checks` (``--only server|spark`` picks
one side), prints one row per check (section, check, status, detail) or, with ``-o json``,
``{"version": 1, "ok": bool, "redis_url": masked, "namespace", "durability", "checks": [{"section",
"name", "status", "detail"}]}``. It writes nothing to the server and starts no JVM. Exit status 0
when no check failed (warnings allowed), 1 when one did, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ftlayer.config import mask_url
from runtime.cli.common import add_output_option, connection_options, load_config, render_table
from runtime.cli.doctor_checks import Check, server_checks, spark_checks

JSON_VERSION = 1


def run_doctor(args: argparse.Namespace) -> int:
    """The ``doctor`` command (see the module contract). Returns the exit code."""
    config = load_config(args)
    checks: list[Check] = []
    if args.only in (None, "server"):
        checks += server_checks(config)
    if args.only in (None, "spark"):
        checks += spark_checks()
    ok = all(c.status != "fail" for c in checks)
    if args.output == "json":
        print(json.dumps({
            "version": JSON_VERSION, "ok": ok, "redis_url": mask_url(config.redis_url) or None,
            "namespace": config.namespace, "durability": config.durability,
            "checks": [{"section": c.section, "name": c.name, "status": c.status, "detail": c.detail} for c in checks],
        }, indent=2))
        return 0 if ok else 1
    print(f"ftlayer doctor: namespace {config.namespace!r}, durability {config.durability!r}")
    print(render_table(["SECTION", "CHECK", "STATUS", "DETAIL"],
                       [[c.section, c.name, c.status.upper(), c.detail] for c in checks], align="llll"))
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    print(f"{failed} failed, {warned} warning(s)" if failed or warned else "all checks passed")
    return 0 if ok else 1


def add_parser(sub: Any) -> None:
    """Add ``ftlayer doctor`` to the CLI's subparsers."""
    p = sub.add_parser(
        "doctor", parents=[connection_options()],
        help="check the server (version, eviction, AOF, ACL rights, cluster) and the Spark side",
        description="Check what ftlayer needs before a job runs. Server (the configured redis_url): reachable, "
                    "version (Valkey, or Redis >= 7.0), maxmemory-policy noeviction, AOF as the durability mode "
                    "needs, replication, the ACL rights for every command ftlayer sends on the namespace's keys "
                    "(probed inside MULTI ... DISCARD: nothing runs), and the cluster state on a cluster. Spark: "
                    "pyspark >= 4.0, pandas and pyarrow, java >= 17 (its version read from 'java -version'; no "
                    "Spark JVM is started). Writes nothing. Exit status 0 no check failed, 1 one failed, 2 usage.",
    )
    p.add_argument("--only", choices=("server", "spark"), default=None,
                   help="run only the server checks or only the Spark checks (default both)")
    add_output_option(p)
    p.set_defaults(func=run_doctor)

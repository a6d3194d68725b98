"""Shared pieces of the operator commands (``ftlayer status``, ``ftlayer dlq``).

Contract:

- Configuration comes from :meth:`ftlayer.config.FTConfig.load`: defaults, the
  TOML file (``--config`` / ``$FTLAYER_CONFIG`` / ``./ftlayer.toml``),
  ``FTLAYER_*`` environment variables, then the command-line options, which win.
- Operator commands talk to the server that is configured. With none, ``status``,
  ``dlq`` and ``sources`` read the state of a topology run here that has ended
  (:mod:`runtime.cli.stopped_state`); they never start an empty embedded server,
  which would show an empty namespace and mislead.
- Nothing here prints or raises a password: URLs pass through
  :func:`ftlayer.store.connection.mask_url`, and Redis errors are re-raised as
  :class:`CLIError` naming the masked URL.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from ftlayer.config import FTConfig, mask_url
from ftlayer.errors import FTLayerError
from ftlayer.keyspace.keys import check_name
from ftlayer.status.read_model import SourceName, registered_sources
from ftlayer.store.connection import client_for


class CLIError(FTLayerError):
    """An operator command cannot do what it was asked; the message says what to do instead."""


# The connection options' destinations; ``ftlayer --namespace x status`` stores the ones given before
# the command under ``before_<dest>`` (see :func:`merge_connection_options`).
CONNECTION_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--redis-url", "redis_url"), ("--namespace", "namespace"), ("--config", "config"),
)
BEFORE = "before_"


def add_connection_options(
    parser: argparse.ArgumentParser, namespace_help: str | None = None, *, before_command: bool = False
) -> None:
    """Add --redis-url, --namespace and --config to ``parser`` (each help names its env var).

    ``namespace_help`` replaces the --namespace help for a command whose default differs.
    ``before_command``: the top-level parser's copies, stored under ``before_<dest>`` so that a
    subcommand's own default (None) cannot overwrite them; :func:`merge_connection_options`
    joins the two.
    """
    title = "connection (before or after the command)" if before_command else "connection"
    g = parser.add_argument_group(title)
    prefix = BEFORE if before_command else ""
    g.add_argument(
        "--redis-url", default=None, metavar="URL", dest=prefix + "redis_url",
        help="redis:// or rediss:// URL of the server the topology uses; user and password are "
             "allowed and never printed [env FTLAYER_REDIS_URL]",
    )
    g.add_argument(
        "--namespace", default=None, metavar="NAMESPACE", dest=prefix + "namespace",
        help=namespace_help or "key prefix the topology was started with; default 'ftlayer' [env FTLAYER_NAMESPACE]",
    )
    g.add_argument(
        "--config", default=None, metavar="PATH", dest=prefix + "config",
        help="ftlayer TOML config file; default ./ftlayer.toml if it exists [env FTLAYER_CONFIG]",
    )


def connection_options(namespace_help: str | None = None) -> argparse.ArgumentParser:
    """A parent parser with the connection options (:func:`add_connection_options`)."""
    p = argparse.ArgumentParser(add_help=False)
    add_connection_options(p, namespace_help)
    return p


def merge_connection_options(args: argparse.Namespace, command_parser: argparse.ArgumentParser) -> None:
    """Join the connection options given before the command with those given after it.

    Given after the command wins (the later one, as with a repeated option). One given before a
    command that does not take it is a usage error of that command (``command_parser.error``:
    its usage, exit 2), not silently ignored.
    """
    takes = {a.dest for a in command_parser._actions}
    for flag, dest in CONNECTION_OPTIONS:
        before = getattr(args, BEFORE + dest, None)
        if hasattr(args, BEFORE + dest):
            delattr(args, BEFORE + dest)
        if before is None:
            continue
        if dest not in takes:
            command_parser.error(f"{flag} does not apply to {command_parser.prog}")
        if getattr(args, dest, None) is None:
            setattr(args, dest, before)


OUTPUTS = ("table", "json")


def add_output_option(parser: argparse.ArgumentParser) -> None:
    """``-o/--output table|json`` (default table), and ``--json`` as the older spelling of ``-o json``.

    Both store ``args.output``; the last one given wins.
    """
    parser.add_argument(
        "-o", "--output", choices=OUTPUTS, default="table",
        help="table: aligned columns for people (default); json: one document with stable keys, for scripts",
    )
    parser.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``1.5h``, ``3d`` or ``2w`` as seconds (>= 0); an argparse type.

    Raises :class:`argparse.ArgumentTypeError` (a usage error: the command's usage, exit 2).
    """
    raw = text.strip().lower()
    unit = raw[-1:] if raw[-1:] in _UNITS else "s"
    number = raw[:-1] if raw[-1:] in _UNITS else raw
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        msg = f"invalid duration {text!r}: expected a number of seconds or one with a unit, like 90s, 15m, 2h, 3d"
        raise argparse.ArgumentTypeError(msg)
    return value


def positive_int(text: str) -> int:
    """An integer >= 1; an argparse type (a usage error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"invalid value {text!r}: expected an integer >= 1"
        raise argparse.ArgumentTypeError(msg)
    return value


def source_options(parser: argparse.ArgumentParser, *, one: bool = False) -> None:
    """Add --topology and --source filters to ``parser``; ``one``: the command acts on one source."""
    if one:  # one_source(): they pick the source, and may be left out when only one is registered
        parser.add_argument("--topology", default=None,
                            help="the source's topology; needed when more than one registered source matches")
        parser.add_argument("--source", default=None,
                            help="the source; needed when more than one registered source matches")
        return
    parser.add_argument("--topology", default=None, help="only this topology (default: all)")
    parser.add_argument("--source", default=None, help="only this source (default: all)")


def load_config(args: argparse.Namespace) -> FTConfig:
    """The effective config: file, env, then the --redis-url / --namespace options."""
    overrides: dict[str, Any] = {}
    if getattr(args, "redis_url", None) is not None:
        overrides["redis_url"] = args.redis_url
    if getattr(args, "namespace", None) is not None:
        overrides["namespace"] = args.namespace
    return FTConfig.load(getattr(args, "config", None), env=os.environ, **overrides)


def embedded_url_hint(config: FTConfig) -> str:
    """Where a topology run here without ``redis_url`` noted its embedded server's URL, as a hint
    for the no-URL error ('' if none): ``<state_dir>/<topology>/redis/url`` (ftlayer.servers.state_dir).
    Only a hint: the file outlives the server, and the commands never connect to it by themselves."""
    if config.state_temporary or config.embedded_data_dir:
        return ""
    try:
        found = sorted(Path(config.state_dir).expanduser().glob("*/redis/url"))[:3]
        notes = [f"{path} says {path.read_text().strip()}" for path in found]
    except OSError:
        return ""
    if not notes:
        return ""
    return (f". A topology run here without redis_url notes its embedded server's URL: {'; '.join(notes)}; "
            f"while that program runs, pass it with --redis-url")


def connect_configured(config: FTConfig, command: str, why: str = "") -> redis.Redis:
    """A client for the configured server; :class:`CLIError` if no URL is configured (``why``: why no
    stopped topology's state could be read instead)."""
    if not config.redis_url:
        if why:
            msg = (f"no Redis URL configured (pass --redis-url or set FTLAYER_REDIS_URL), and 'ftlayer {command}' "
                   f"reads a topology's state here only once it has ended: {why}")
        else:
            msg = (f"no Redis URL configured: pass --redis-url or set FTLAYER_REDIS_URL (or redis_url in the "
                   f"config file). 'ftlayer {command}' does not start an empty embedded server: it would show "
                   f"nothing{embedded_url_hint(config)}")
        raise CLIError(msg)
    return client_for(config.redis_url, config.connect_timeout_s)


@contextmanager
def connected(config: FTConfig, command: str, topology: str | None = None) -> Iterator[tuple[FTConfig, redis.Redis]]:
    """The config (its ``redis_url`` set) and a client, for a command that reads a server: the configured
    one, else the state of the one topology here that is not running, served until the block ends
    (:mod:`runtime.cli.stopped_state`); :class:`CLIError` if neither."""
    from runtime.cli.stopped_state import StoppedState, serve_stopped_state

    got = None if config.redis_url else serve_stopped_state(config, command, topology)
    served = got if isinstance(got, StoppedState) else None
    try:
        if served is not None:
            config = config.replace(redis_url=served.url)
        yield config, connect_configured(config, command, got if isinstance(got, str) else "")
    finally:
        if served is not None:
            served.close()


@contextmanager
def redis_errors(config: FTConfig) -> Iterator[None]:
    """Turn Redis client errors into :class:`CLIError` naming the masked URL."""
    try:
        yield
    except redis.RedisError as exc:
        msg = f"Redis at {mask_url(config.redis_url)} failed: {exc}"
        raise CLIError(msg) from exc


def select_sources(
    client: redis.Redis, namespace: str, topology: str | None, source: str | None
) -> list[SourceName]:
    """Registered sources matching the optional filters (each filter must be a valid name)."""
    if topology is not None:
        check_name("topology", topology)
    if source is not None:
        check_name("source", source)
    return [
        (t, s) for t, s in registered_sources(client, namespace)
        if (topology is None or t == topology) and (source is None or s == source)
    ]


def one_source(
    client: redis.Redis, config: FTConfig, topology: str | None, source: str | None
) -> SourceName:
    """The single registered source the filters pick; :class:`CLIError` if none or several."""
    found = select_sources(client, config.namespace, topology, source)
    if len(found) == 1:
        return found[0]
    where = f"namespace {config.namespace!r} at {mask_url(config.redis_url)}"
    if not found:
        wanted = "/".join(x or "*" for x in (topology, source))
        msg = f"no registered source matches {wanted} in {where}"
        raise CLIError(msg)
    names = ", ".join(f"{t}/{s}" for t, s in found)
    msg = f"several sources in {where} ({names}): pass --topology and --source"
    raise CLIError(msg)


def format_ms(ms: float | None) -> str:
    """A wall-clock time in ms as ``YYYY-MM-DD HH:MM:SS UTC`` ('-' for None or 0)."""
    if not ms:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_duration(seconds: float | None) -> str:
    """A duration as ``12.3s``, ``1m40s``, ``2h03m`` or ``3d04h`` ('-' for None)."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s"
    whole = int(s)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def render_table(header: list[str], rows: list[list[str]], align: str = "") -> str:
    """Plain-text columns two spaces apart; ``align`` has one 'l' or 'r' per column.

    The default aligns the first column left and the others right.
    """
    align = align or "l" + "r" * (len(header) - 1)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [
            c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join(line(r) for r in [header, *rows])

"""Where option values come from: a TOML file, ``FTLAYER_*`` environment variables, ``spark.ftlayer.*`` Spark conf.

Contract: each reader returns the parsed values of the options it found, with their origin
(``"file <path>"``, ``"env FTLAYER_<NAME>"``, ``"Spark conf spark.ftlayer.<name>"``); a value
that does not parse, or an unknown Spark conf key, is refused with a ConfigError naming where it
came from. Validation of the values themselves is :class:`~ftlayer.config.options.FTConfig`'s.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ftlayer.config.checks import bad
from ftlayer.errors import ConfigError

__all__ = [
    "CONFIG_FILE_ENV",
    "DEFAULT_CONFIG_FILE",
    "ENV_PREFIX",
    "SPARK_PREFIX",
    "config_file_path",
    "config_path",
    "env_values",
    "naming_origin",
    "parse_bool",
    "read_toml",
    "spark_values",
]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ENV_PREFIX = "FTLAYER_"
SPARK_PREFIX = "spark.ftlayer."
CONFIG_FILE_ENV = "FTLAYER_CONFIG"
DEFAULT_CONFIG_FILE = "ftlayer.toml"


@contextlib.contextmanager
def naming_origin(origins: Mapping[str, str]) -> Iterator[None]:
    """Re-raise a validation error of an option that came from a file, env or Spark conf naming that origin."""
    try:
        yield
    except ConfigError as exc:
        where = origins.get(exc.option or "")
        if where is None:
            raise
        head, sep, tail = str(exc).partition(": expected ")
        msg = f"{head} (from {where}){sep}{tail}"
        err = ConfigError(msg)
        err.option = exc.option
        raise err from exc


def spark_values(spark_conf: Mapping[str, str], known: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The parsed ``spark.ftlayer.*`` options of ``spark_conf`` with their origin; unknown keys refused."""
    out: dict[str, tuple[Any, str]] = {}
    for key, raw in spark_conf.items():
        if not key.startswith(SPARK_PREFIX):
            continue
        name = key[len(SPARK_PREFIX):]
        if name not in known:
            bad(key, raw, f"one of {sorted(SPARK_PREFIX + n for n in known)}")
        out[name] = (_parse(name, raw, str(known[name].type), f"Spark conf {key}"), f"Spark conf {key}")
    return out


def env_values(env: Mapping[str, str], known: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """The parsed ``FTLAYER_<NAME>`` options of ``env`` with their origin."""
    out: dict[str, tuple[Any, str]] = {}
    for name, f in known.items():
        var = ENV_PREFIX + name.upper()
        raw = env.get(var)
        if raw is not None:
            out[name] = (_parse(name, raw, str(f.type), f"env {var}"), f"env {var}")
    return out


def _parse(name: str, raw: str, type_name: str, where: str) -> Any:
    raw = raw.strip()
    try:
        if type_name == "int":
            return int(raw.replace("_", ""))
        if type_name == "float":
            return float(raw)
    except ValueError as exc:
        expected = "an integer" if type_name == "int" else "a number"
        msg = f"invalid ftlayer option {name}={raw!r} (from {where}): expected {expected}"
        err = ConfigError(msg)
        err.option = name
        raise err from exc
    if type_name == "bool":
        return parse_bool(name, raw, where)
    return raw


def parse_bool(name: str, raw: str, where: str) -> bool:
    """A boolean option's text (1/true/yes/on or 0/false/no/off, any case); ConfigError names it."""
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    msg = f"invalid ftlayer option {name}={raw!r} (from {where}): expected true or false"
    raise ConfigError(msg)


def config_file_path(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The TOML file :meth:`FTConfig.load` reads: ``path``, else ``$FTLAYER_CONFIG``, else ./ftlayer.toml if any."""
    return config_path(path, os.environ if env is None else env)


def config_path(path: str | Path | None, env: Mapping[str, str]) -> Path | None:
    if path is not None:
        return Path(path)
    if env.get(CONFIG_FILE_ENV):
        return Path(env[CONFIG_FILE_ENV])
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as exc:
        msg = f"ftlayer config file {str(path)!r} does not exist"
        raise ConfigError(msg) from exc
    except tomllib.TOMLDecodeError as exc:
        msg = f"ftlayer config file {str(path)!r} is not valid TOML: {exc}"
        raise ConfigError(msg) from exc
    table = data.get("ftlayer", data)
    if not isinstance(table, dict):
        msg = f"ftlayer config file {str(path)!r}: [ftlayer] must be a table"
        raise ConfigError(msg)
    return dict(table)

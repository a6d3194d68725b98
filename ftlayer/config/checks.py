"""The refusal of a bad option value: a ConfigError naming the option, the value and what is allowed.

Contract: every check returns None for a good value and raises :class:`~ftlayer.errors.ConfigError`
with ``option`` set for a bad one, worded "invalid ftlayer option NAME=VALUE: expected ALLOWED".
"""

from __future__ import annotations

import math
from typing import Any

from ftlayer.errors import ConfigError

__all__ = ["at_least", "bad", "between", "expected_type", "one_of", "positive"]

TYPES: dict[str, type | tuple[type, ...]] = {"str": str, "int": int, "float": (int, float), "bool": bool}


def expected_type(type_name: Any) -> type | tuple[type, ...]:
    return TYPES[str(type_name)]


def bad(option: str, value: Any, allowed: str) -> None:
    msg = f"invalid ftlayer option {option}={value!r}: expected {allowed}"
    err = ConfigError(msg)
    err.option = option
    raise err


def one_of(option: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        bad(option, value, "one of " + ", ".join(repr(a) for a in allowed))


def positive(option: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        bad(option, value, "a finite number > 0")


def at_least(option: str, value: float, low: float) -> None:
    if not (value >= low and math.isfinite(value)):
        bad(option, value, f"a finite number >= {low}")


def between(option: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        bad(option, value, f"an integer from {low} to {high}")

"""Optional extras of the effectively-once sinks: imported when first used, with one clear error."""

from __future__ import annotations

import importlib
from types import ModuleType

from ftlayer.errors import FTLayerError

__all__ = ["import_extra"]


def import_extra(module: str, needs: str, extra: str, error: type[FTLayerError]) -> ModuleType:
    """``module``, or ``error`` saying ``needs`` and which ftlayer extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        msg = f"{needs}: pip install 'ftlayer[{extra}]'"
        raise error(msg) from exc

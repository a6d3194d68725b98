"""The chaos scenarios' error (its own module: the scenario base and the sink targets both raise it)."""

from __future__ import annotations

from ftlayer.errors import FTLayerError

__all__ = ["ChaosError"]


class ChaosError(FTLayerError):
    """A chaos scenario could not run (unknown scenario, bad parameter, a query that keeps dying)."""

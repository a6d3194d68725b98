"""Logger names: every logger of the distribution lives under ``ftlayer``.

A user configures ftlayer's logging in one place (``logging.getLogger("ftlayer")``), whatever
package of the distribution a message comes from: the core's modules are ``ftlayer.*`` already;
the runtime's (``runtime.spark.ft_source``) log as ``ftlayer.runtime.spark.ft_source``.
"""

from __future__ import annotations

import logging

__all__ = ["ROOT", "logger_for"]

ROOT = "ftlayer"


def logger_for(module: str) -> logging.Logger:
    """The logger of ``module`` (pass ``__name__``), under ``ftlayer``."""
    if module == ROOT or module.startswith(f"{ROOT}."):
        return logging.getLogger(module)
    return logging.getLogger(f"{ROOT}.{module}")

"""Every logger of the distribution lives under ``ftlayer`` (ftlayer.logs)."""

from __future__ import annotations

import importlib
import logging
import pkgutil

import pytest

import runtime
from ftlayer.logs import logger_for


def test_runtime_modules_log_under_ftlayer() -> None:
    assert logger_for("runtime.spark.ft_source").name == "ftlayer.runtime.spark.ft_source"
    assert logger_for("ftlayer.server").name == "ftlayer.server"


def test_no_module_of_the_distribution_makes_a_logger_outside_ftlayer(caplog: pytest.LogCaptureFixture) -> None:
    for info in pkgutil.walk_packages(runtime.__path__, "runtime."):
        if ".chaos." in info.name or info.name.endswith("__main__"):
            continue  # chaos programs are importable too, but some start work when run as main
        importlib.import_module(info.name)
    outside = sorted(name for name in logging.root.manager.loggerDict
                     if name.startswith(("runtime", "serialization")))
    assert outside == []
    with caplog.at_level(logging.INFO, logger="ftlayer"):
        logging.getLogger("ftlayer.runtime.driver.ingest").info("seen through the ftlayer logger")
    assert "seen through the ftlayer logger" in caplog.text

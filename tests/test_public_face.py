"""The public face: what a user imports from ``ftlayer``, and what importing it costs."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import ftlayer


def test_every_public_name_resolves() -> None:
    for name in ftlayer.__all__:
        assert getattr(ftlayer, name) is not None, name
    from ftlayer import FailRecord, FTConfig, Topology

    assert Topology.__module__ == "runtime.topology"
    assert FailRecord.__module__ == "ftlayer.errors"
    assert FTConfig().namespace == "ftlayer"


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Topolgy'"):
        ftlayer.Topolgy  # noqa: B018


def test_importing_the_core_loads_neither_runtime_nor_spark() -> None:
    code = (
        "import sys, ftlayer, ftlayer.facade.ft_layer, ftlayer.facade.service\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('runtime', 'pyspark', 'partitioners'))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    "module",
    ["ftlayer.config", "ftlayer.errors", "ftlayer.facade.ft_layer", "runtime.topology", "runtime.query",
     "runtime.sinks", "runtime.testing", "runtime.checker", "runtime.spark.session", "serialization",
     "partitioners"],
)
def test_public_modules_declare_all(module: str) -> None:
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    assert names, f"{module} declares no __all__"
    for name in names:
        assert hasattr(mod, name), f"{module}.__all__ names {name!r}, which it lacks"


def test_all_lists_every_lazy_name() -> None:
    assert set(ftlayer._LAZY) <= set(ftlayer.__all__)

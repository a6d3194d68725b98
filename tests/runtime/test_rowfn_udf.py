"""``ftlayer.udf`` builds a plain row UDF without Spark's "Cannot infer the eval type" warning."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import ftlayer
from ftlayer.config import FTConfig

pytestmark = pytest.mark.spark


def test_ftlayer_udf_builds_without_a_type_hint_warning(spark: Any, ft_config: FTConfig) -> None:
    def upper(s: str) -> str:
        return s.upper()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        fn = ftlayer.udf(upper, "string", config=ft_config)
        col = fn("page")
    assert "upper" in str(col) or "guarded" in str(col)

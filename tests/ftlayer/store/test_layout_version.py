"""A source's layout format is checked on open: format 3 is read, any other is refused with what to do
and left as it is (real server). Formats 1 and 2 were never released and are no longer migrated."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ftlayer.errors import ConfigError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import FORMAT_VERSION
from ftlayer.store.layout_version import ensure_layout
from serialization.serializers import make_record


def test_a_current_source_is_left_as_it_is(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer()
    layer.persist([make_record(layer, "x")])
    assert ensure_layout(layer.store) == FORMAT_VERSION
    assert make_layer().pending_count() == 1


@pytest.mark.parametrize("old", [1, 2])
def test_an_unreleased_older_format_is_refused_with_what_to_do(make_layer: Callable[..., FTLayer], old: int) -> None:
    layer = make_layer()
    layer.persist([make_record(layer, "x")])
    meta = layer.store.keys.meta
    layer.store.client.hset(meta, "format", old)
    with pytest.raises(ConfigError, match=f"layout format {old}.*no longer migrates.*ftlayer sources reset topo src"):
        make_layer()
    assert layer.store.client.hget(meta, "format") == str(old).encode()  # nothing was changed
    assert layer.pending_count() == 1


def test_a_newer_format_is_refused_and_left_alone(make_layer: Callable[..., FTLayer]) -> None:
    layer = make_layer()
    layer.store.client.hset(layer.store.keys.meta, "format", FORMAT_VERSION + 1)
    with pytest.raises(ConfigError, match="upgrade ftlayer"):
        make_layer()
    assert layer.store.client.hget(layer.store.keys.meta, "format") == str(FORMAT_VERSION + 1).encode()

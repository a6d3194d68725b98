from __future__ import annotations

from runtime.cli.docgen import CONFIG_DOC, configuration_markdown


def test_configuration_reference_is_current() -> None:
    assert CONFIG_DOC.read_text() == configuration_markdown(), "run: python -m runtime.cli.docgen"

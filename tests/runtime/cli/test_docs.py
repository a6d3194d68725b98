from __future__ import annotations

from runtime.cli.docgen import CLI_DOC, CONFIG_DOC, cli_markdown, configuration_markdown


def test_configuration_reference_is_current() -> None:
    assert CONFIG_DOC.read_text() == configuration_markdown(), "run: python -m runtime.cli.docgen"


def test_cli_reference_is_the_parsers_help() -> None:
    text = cli_markdown()
    assert "## ftlayer dlq requeue" in text and "--dry-run" in text and "## ftlayer doctor" in text
    assert CLI_DOC.read_text() == text, "run: python -m runtime.cli.docgen"

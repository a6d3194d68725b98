"""Confirmation of a destructive or bulk action: ``--yes``, or a typed ``yes`` at a terminal.

Contract of :func:`confirmed`: with ``--yes`` it returns True without asking. Otherwise, at an
interactive terminal it asks and returns True only for a typed ``yes`` (anything else, or end of
input, is no); without a terminal (a script, CI, a pipe) it asks nothing, prints how to confirm
and returns False, so that a script never hangs on a prompt nor acts without saying ``--yes``.
The caller prints what would be done before calling it, and exits 1 when it returns False.
"""

from __future__ import annotations

import sys


def interactive() -> bool:
    """Standard input is a terminal (a person may answer a prompt)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def confirmed(yes: bool, action: str, nothing: str) -> bool:
    """Whether to go on with ``action`` (e.g. "delete them"); prints ``nothing`` (e.g. "nothing
    deleted") when not."""
    if yes:
        return True
    if not interactive():
        print(f"{nothing}: pass --yes to {action}")
        return False
    try:
        answer = input(f"type 'yes' to {action}: ")
    except EOFError:
        answer = ""
    if answer.strip() != "yes":
        print(nothing)
        return False
    return True

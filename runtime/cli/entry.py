"""The ``ftlayer`` console script: checks that the driver extra is installed, then runs the CLI.

The CLI renders progress with rich and serves metrics with prometheus_client, both in ftlayer's
``driver`` extra (``pip install 'ftlayer[driver]'``; executors install ftlayer without it). A
missing one ends in one line naming the extra and exit status 2, not in a traceback.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["DRIVER_MODULES", "main", "missing_driver_modules"]

DRIVER_MODULES = ("rich", "prometheus_client")  # what the CLI imports from the driver extra


def missing_driver_modules() -> list[str]:
    """The driver extra's modules that cannot be imported here."""
    missing = []
    for name in DRIVER_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, a broken package
            found = False
        if not found:
            missing.append(name)
    return missing


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ftlayer`` console script (and ``python -m runtime.cli.entry``)."""
    missing = missing_driver_modules()
    if missing:
        print(f"ftlayer: error: the CLI needs ftlayer's driver extra, which is not installed (missing "
              f"{', '.join(missing)}): pip install 'ftlayer[driver]'", file=sys.stderr)
        return 2
    from runtime.cli.main import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

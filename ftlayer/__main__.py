"""``python -m ftlayer``: the ``ftlayer`` command line (:mod:`runtime.cli.main`), for environments
where the console script is not on PATH (a venv not activated, a Spark node's Python)."""

from __future__ import annotations

import sys

from runtime.cli.entry import main

if __name__ == "__main__":
    sys.exit(main())

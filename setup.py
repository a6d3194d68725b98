"""setuptools' hook for the one file pyproject.toml cannot place: the start-up hook
``ftlayer-installed-pyspark.pth`` goes to the top of site-packages, where ``site`` reads ``.pth``
files (runtime/spark/installed_pyspark.py says what it does and why). Everything else is in
pyproject.toml. An editable install does not get it from here: scripts/_venv.sh copies it.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = os.path.join("runtime", "spark", "ftlayer-installed-pyspark.pth")


class BuildPyWithPth(build_py):
    """build_py, plus the ``.pth`` file at the top of the build directory (so of the wheel)."""

    def run(self) -> None:
        super().run()
        self.copy_file(PTH, os.path.join(self.build_lib, os.path.basename(PTH)), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, os.path.basename(PTH))]


setup(cmdclass={"build_py": BuildPyWithPth})

"""Build step that puts the shipped policies and image sources into the wheel.

The repository keeps them at the top level (``policies/``, ``sandbox_images/``: the single
source). A wheel carries a copy at ``supervisor/_data/``, so ``pip install`` (``pipx``,
``uv tool``) of the wheel alone has every shipped policy and can build the images. An
editable install copies nothing: the code finds the checkout's folders instead
(``supervisor/core/paths.py``). Everything else is in ``pyproject.toml``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: Top-level folders copied into the wheel, as ``supervisor/_data/<name>``.
DATA = ("policies", "sandbox_images")
#: Never shipped: build scratch of ``sandvisor images build`` and caches.
IGNORE = shutil.ignore_patterns(".build", "__pycache__", "*.pyc")


class BuildWithData(build_py):
    """``build_py``, then ``policies/`` and ``sandbox_images/`` into the built package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for name in DATA:
            target = Path(self.build_lib) / "supervisor" / "_data" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(ROOT / name, target, ignore=IGNORE)


setup(cmdclass={"build_py": BuildWithData})

"""Old module paths keep working: ``import supervisor.models`` gives ``supervisor.core.models``.

The package was reorganised into layers; scripts written against the flat layout still
import. Each old name is an alias of the new module (the same object, not a copy), and
using one emits a DeprecationWarning naming the new path.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

#: Old dotted path -> where that module lives now.
MOVED: dict[str, str] = {
    **{
        f"supervisor.{name}": f"supervisor.core.{name}"
        for name in (
            "models",
            "events",
            "errors",
            "ids",
            "policy",
            "resolve",
            "lifecycle",
            "stall",
            "monitor",
            "demux",
            "resync",
            "render",
            "logs",
            "faults",
        )
    },
    "supervisor.backend": "supervisor.engine",
    "supervisor.backend.base": "supervisor.engine.base",
    "supervisor.backend.docker": "supervisor.engine.docker",
    "supervisor.procfs": "supervisor.engine.procfs",
    **{
        f"supervisor.{name}": f"supervisor.state.{name}"
        for name in ("store", "eventlog", "sinks", "output")
    },
    "supervisor.runner": "supervisor.runtime.task.runner",
    **{
        f"supervisor.{name}": f"supervisor.runtime.{name}"
        for name in ("session", "pool", "stall_watch", "supervisor")
    },
    "supervisor.client": "supervisor.interfaces.client",
    "supervisor.daemon": "supervisor.interfaces.daemon",
    "supervisor.daemon.app": "supervisor.interfaces.daemon.app",
    "supervisor.daemon.auth": "supervisor.interfaces.daemon.auth",
    "supervisor.daemon.serve": "supervisor.interfaces.daemon.serve",
    "supervisor.daemon.webhook": "supervisor.interfaces.daemon.webhook",
    "supervisor.mcp_server": "supervisor.interfaces.mcp.server",
    "supervisor.cli": "supervisor.interfaces.cli",
    "supervisor.cli.main": "supervisor.interfaces.cli.main",
    "supervisor.images": "supervisor.tooling.images",
    "supervisor.doctor": "supervisor.tooling.doctor",
}


# The loader and finder do not derive from importlib.abc's classes: the import system needs
# only their methods, and importing importlib.abc (it pulls in importlib.resources) was a
# tenth of the start-up time of a CLI command such as ``sbx ps``.


class _Alias:
    """Loads an old path as the module at its new path."""

    def __init__(self, new: str) -> None:
        self.new = new
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run; undo the import system's rebinding of ``__spec__`` to the alias."""
        module.__spec__ = self._spec


class _Finder:
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("Loader", _Alias(new)))


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())

"""Where things live on the host: the state directory and the daemon's files in it."""

from __future__ import annotations

import os
from pathlib import Path


def shipped_data_dir(name: str) -> Path | None:
    """A folder shipped with sandvisor (``policies``, ``sandbox_images``): the installed
    wheel's copy in ``supervisor/_data/<name>``, else the one at the top of this checkout
    (an editable install, or running from the source tree), else None."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "_data" / name
    if installed.is_dir():
        return installed
    checkout = package.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / name).is_dir():
        return checkout / name
    return None


def default_state_dir() -> Path:
    """``$SANDVISOR_STATE_DIR``, else ``$XDG_STATE_HOME/sandvisor``.

    Else ``~/.local/state/sandvisor``.
    """
    env = os.environ.get("SANDVISOR_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) / "sandvisor" if xdg else Path.home() / ".local" / "state" / "sandvisor"


def daemon_dir(state_dir: Path | None = None) -> Path:
    """The daemon's folder in ``state_dir``: its socket, admin token and ``daemon.json``."""
    return (state_dir or default_state_dir()) / "daemon"


def daemon_socket(state_dir: Path | None = None) -> Path:
    """``$SANDVISOR_SOCKET``, else the daemon's unix socket in ``state_dir``."""
    return Path(os.environ.get("SANDVISOR_SOCKET") or daemon_dir(state_dir) / "sandvisor.sock")


def admin_token_file(state_dir: Path | None = None) -> Path:
    """The daemon's admin token (mode 0600)."""
    return daemon_dir(state_dir) / "admin.token"


def daemon_info_file(state_dir: Path | None = None) -> Path:
    """``daemon.json``: the running daemon's pid, socket, TCP address and token file."""
    return daemon_dir(state_dir) / "daemon.json"

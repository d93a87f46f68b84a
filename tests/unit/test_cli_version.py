"""``sandvisor --version`` prints the installed distribution's version."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from supervisor.interfaces.cli.main import main


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"sandvisor {version('sandbox-supervisor')}\n"

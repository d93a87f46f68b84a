"""CLI helpers: option types (durations, non-negative integers) and how the real parser
reports bad values: one line naming the option, exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.interfaces.cli import images as cli_images
from supervisor.interfaces.cli.common import duration_ms, duration_s, nonnegative_int
from supervisor.interfaces.cli.main import build_parser

HELP = "use a number with ms, s, m or h (e.g. 500ms, 30s, 5m, 1h)"


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("500ms", 500),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("2", 2000),
        ("1.5", 1500),
        ("1.5s", 1500),
        ("0.25m", 15_000),
        (" 5 m ", 300_000),
        ("1ms", 1),
    ],
)
def test_duration_ms(text: str, ms: int) -> None:
    assert duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["", " ", "abc", "5x", "5 sec", "-1s", "1e3", "5M", "ms", "1.s", "1h30m"]
)
def test_invalid_durations_are_argparse_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        duration_ms(text)
    assert str(info.value) == f"invalid duration {text!r}: {HELP}"


@pytest.mark.parametrize("text", ["0", "0s", "0ms", "0.0h", "0.4ms"])
def test_shorter_than_a_millisecond_is_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at least 1ms"):
        duration_ms(text)


@pytest.mark.parametrize("text", ["1" * 400, "9" * 11 + "s", "2" * 300 + "h"])
def test_huge_durations_are_argparse_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        duration_ms(text)
    message = str(info.value)
    assert message.startswith(f"invalid duration {text[:40]!r}"[:-1])
    assert "too long" in message
    assert len(message) < 120


def test_argparse_types() -> None:
    assert duration_s("1500ms") == 1.5
    assert duration_ms("2m") == 120_000
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--timeout", type=duration_ms)
    assert parser.parse_args(["--timeout", "30s"]).timeout == 30_000
    with pytest.raises(argparse.ArgumentError, match="invalid duration 'soon'"):
        parser.parse_args(["--timeout", "soon"])


@pytest.mark.parametrize(("text", "value"), [("0", 0), ("7", 7), ("123456", 123456)])
def test_nonnegative_int_accepts(text: str, value: int) -> None:
    assert nonnegative_int("a count")(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-1", "must be 0 or more, got -1"),
        ("abc", "expected a count, got 'abc'"),
        ("1.5", "expected a count, got '1.5'"),
        ("", "expected a count, got ''"),
    ],
)
def test_nonnegative_int_rejects(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        nonnegative_int("a count")(text)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["events", "--since", "-1"], "argument --since: must be 0 or more, got -1"),
        (["events", "--since", "x"], "argument --since: expected an event seq number, got 'x'"),
        (["logs", "T", "--tail", "-3"], "argument --tail: must be 0 or more, got -3"),
        (["logs", "T", "--tail", "abc"], "argument --tail: expected a number of lines, got 'abc'"),
        (["run", "--timeout", "5x", "--", "true"], "argument --timeout: invalid duration '5x'"),
        (["wait", "--timeout", "0", "T"], "argument --timeout: invalid duration '0': must be"),
        (["run", "--poll-every", "1" * 400, "--", "true"], "argument --poll-every: invalid"),
    ],
)
def test_cli_names_the_option_and_the_bad_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_400_digit_timeout_is_one_line_and_no_traceback() -> None:
    """Through the real entry point: the duration is refused while parsing the options,
    before any daemon is looked for."""
    argv = ["run", "--timeout", "1" * 400, "--", "true"]
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.interfaces.cli.main", *argv],
        capture_output=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 2
    err = result.stderr.decode()
    assert "Traceback" not in err
    [last] = [line for line in err.splitlines() if "error" in line]
    assert last.startswith("sandvisor run: error: argument --timeout: invalid duration '1111")
    assert last.endswith("too long (at most 1000000000s)")
    assert result.stdout == b""


def test_the_image_names_in_the_help_are_the_builders() -> None:
    """cli/images.py spells the names out so registering it imports no docker SDK."""
    from supervisor.tooling.images import IMAGES  # noqa: PLC0415

    assert cli_images.IMAGES == IMAGES

"""CLI helpers: durations, non-negative integers, and how the parser reports bad values."""

from __future__ import annotations

import argparse

import pytest

from supervisor.interfaces.cli.common import (
    duration_ms,
    duration_s,
    nonnegative_int,
    parse_duration_ms,
)
from supervisor.interfaces.cli.main import build_parser


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
def test_parse_duration_ms(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


def test_default_unit() -> None:
    assert parse_duration_ms("250", default_unit="ms") == 250
    assert parse_duration_ms("2", default_unit="m") == 120_000
    assert parse_duration_ms("2s", default_unit="ms") == 2000


@pytest.mark.parametrize(
    "text", ["", " ", "abc", "5x", "5 sec", "-1s", "1e3", "5M", "ms", "1.s", "1h30m"]
)
def test_invalid_durations_are_argparse_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        parse_duration_ms(text)
    assert str(info.value) == (
        f"invalid duration {text!r}: use a number with ms, s, m or h (e.g. 500ms, 30s, 5m, 1h)"
    )


@pytest.mark.parametrize("text", ["0", "0s", "0ms", "0.0h"])
def test_zero_is_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at least 1ms"):
        parse_duration_ms(text)


@pytest.mark.parametrize("text", ["0.5ms", "0.0001s"])
def test_sub_millisecond_durations_are_not_zero(text: str) -> None:
    try:
        value = parse_duration_ms(text)
    except argparse.ArgumentTypeError:
        return
    assert value > 0


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
    ],
)
def test_cli_names_the_option_and_the_bad_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err

"""The pure stall detector, fed recorded observations (no engine, no clock)."""

from __future__ import annotations

import pytest

from supervisor.core.stall import IDLE_CPU_FRACTION, StallDetector, looks_like_prompt


def test_process_state_blocked_long_enough_is_one_stall() -> None:
    d = StallDetector(3.0, now=0.0)
    assert d.due(0.5)
    assert d.observe_process(0.5, blocked_on_stdin=True) is None
    # The next look is scheduled exactly when the wait reaches the threshold.
    assert d.next_check_at() == pytest.approx(3.5)
    assert not d.due(3.0)
    verdict = d.observe_process(3.5, blocked_on_stdin=True)
    assert verdict is not None
    assert verdict.signal == "process_state"
    assert verdict.waiting_s == pytest.approx(3.0)
    # One event per episode: later observations say nothing.
    assert d.in_episode
    assert not d.due(100.0)
    assert d.observe_process(10.0, blocked_on_stdin=True) is None


def test_process_state_interrupted_wait_restarts_the_clock() -> None:
    d = StallDetector(3.0, now=0.0)
    d.observe_process(0.5, blocked_on_stdin=True)
    d.observe_process(2.0, blocked_on_stdin=False)  # it woke up (read something, computed)
    assert d.observe_process(3.6, blocked_on_stdin=True) is None
    assert d.observe_process(6.0, blocked_on_stdin=True) is None
    verdict = d.observe_process(6.6, blocked_on_stdin=True)
    assert verdict is not None
    assert verdict.waiting_s == pytest.approx(3.0)


def test_never_blocked_never_stalls() -> None:
    d = StallDetector(1.0, now=0.0)
    t = 0.0
    while t < 60:
        assert d.observe_process(t, blocked_on_stdin=False) is None
        t += 1.0
    assert not d.in_episode


@pytest.mark.parametrize("end", ["output", "input_sent"])
def test_episode_ends_on_output_or_input(end: str) -> None:
    d = StallDetector(1.0, now=0.0)
    d.observe_process(0.5, blocked_on_stdin=True)
    assert d.observe_process(1.5, blocked_on_stdin=True) is not None
    getattr(d, end)(2.0)
    assert not d.in_episode
    assert d.due(2.5)
    assert d.observe_process(2.5, blocked_on_stdin=True) is None
    assert d.observe_process(3.5, blocked_on_stdin=True) is not None


def test_heuristic_needs_silence_idle_cpu_and_a_prompt() -> None:
    d = StallDetector(3.0, now=0.0)
    # prompt printed at t=1; first look records a CPU mark
    assert d.observe_heuristic(1.5, quiet_since=1.0, cpu_ns=1_000_000, prompt_like=True) is None
    # not quiet long enough yet
    assert d.observe_heuristic(2.5, quiet_since=1.0, cpu_ns=1_000_000, prompt_like=True) is None
    verdict = d.observe_heuristic(4.0, quiet_since=1.0, cpu_ns=1_000_500, prompt_like=True)
    assert verdict is not None
    assert verdict.signal == "heuristic"
    assert verdict.waiting_s == pytest.approx(3.0)


def test_heuristic_busy_cpu_is_not_a_stall() -> None:
    d = StallDetector(1.0, now=0.0)
    d.observe_heuristic(0.5, quiet_since=0.0, cpu_ns=0, prompt_like=True)
    busy = int((IDLE_CPU_FRACTION * 5) * 1e9)  # 10% of a core over one second
    assert d.observe_heuristic(1.5, quiet_since=0.0, cpu_ns=busy, prompt_like=True) is None
    assert d.observe_heuristic(2.5, quiet_since=0.0, cpu_ns=busy * 2, prompt_like=True) is None
    assert not d.in_episode


def test_heuristic_without_prompt_or_cpu_reading_is_not_a_stall() -> None:
    d = StallDetector(1.0, now=0.0)
    for t in (0.5, 1.5, 2.5, 3.5):
        assert d.observe_heuristic(t, quiet_since=0.0, cpu_ns=0, prompt_like=False) is None
    d2 = StallDetector(1.0, now=0.0)
    for t in (0.5, 1.5, 2.5):
        assert d2.observe_heuristic(t, quiet_since=0.0, cpu_ns=None, prompt_like=True) is None


def test_heuristic_output_after_mark_restarts() -> None:
    d = StallDetector(1.0, now=0.0)
    d.observe_heuristic(0.5, quiet_since=0.0, cpu_ns=0, prompt_like=True)
    # output arrived at 0.8: the old CPU mark predates the quiet period and is not used
    assert d.observe_heuristic(1.0, quiet_since=0.8, cpu_ns=0, prompt_like=True) is None
    assert d.observe_heuristic(2.0, quiet_since=0.8, cpu_ns=0, prompt_like=True) is not None


@pytest.mark.parametrize(
    "tail",
    [
        "Continue? [y/N] ",
        "Do you want to proceed (yes/no)",
        "Password: ",
        "Enter passphrase for key '/root/.ssh/id_rsa': ",
        "Username for 'https://github.com': ",
        "Press ENTER to continue",
        "Name: ",
        "> ",
        "working...\nOverwrite file? ",
        "\x1b[1mProceed?\x1b[0m ",
        "#? ",
    ],
)
def test_prompts(tail: str) -> None:
    assert looks_like_prompt(tail)


@pytest.mark.parametrize(
    "tail",
    [
        "",
        "Listening on http://127.0.0.1:8000\n",
        "compiled successfully in 312 ms\n",
        "tick\ntick\n",
        "Done.\n",
        "100%|██████████| 50/50\n",
    ],
)
def test_not_prompts(tail: str) -> None:
    assert not looks_like_prompt(tail)

"""Lifecycle: one outcome per task, whatever order stop requests and exits arrive in."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from supervisor.core.lifecycle import Lifecycle, Outcome, StopRequest, status_for

STOP_REASONS: list[StopRequest] = ["timeout", "user_stopped", "session_ended", "idle_timeout"]
EXIT_CODES = [0, 1, 137]


def _exited(code: int | None, oom: bool) -> Callable[[Lifecycle], Outcome | None]:
    def finish(lc: Lifecycle) -> Outcome | None:
        return lc.finish_exited(code, oom_killed=oom)

    return finish


def _finishers() -> list[tuple[str, Callable[[Lifecycle], Outcome | None]]]:
    out: list[tuple[str, Callable[[Lifecycle], Outcome | None]]] = []
    for code, oom in itertools.product([*EXIT_CODES, None], [False, True]):
        out.append((f"exited({code},oom={oom})", _exited(code, oom)))
    out.append(("lost", lambda lc: lc.finish_lost("engine restarted")))
    out.append(("failed", lambda lc: lc.finish_failed("image_missing", "no such image")))
    out.append(("unstarted", lambda lc: lc.finish_unstarted()))
    return out


FINISHERS = _finishers()


def expected(
    stop: StopRequest | None, started: bool, finisher: str, code: int | None, oom: bool
) -> Outcome | None:
    if finisher == "lost":
        return Outcome("failed", "lost", None, "lost", "engine restarted")
    if finisher == "failed":
        return Outcome("failed", None, None, "image_missing", "no such image")
    if finisher == "unstarted":
        return Outcome("killed", stop, None) if stop is not None else None
    if stop is not None:
        return Outcome("killed", stop, code)
    if oom:
        return Outcome("failed", "oom_killed", code)
    return Outcome("completed" if code == 0 else "failed", "exit", code)


@pytest.mark.parametrize("stop_when", ["never", "before_start", "after_start"])
@pytest.mark.parametrize("reason", STOP_REASONS)
@pytest.mark.parametrize(("fname", "finish"), FINISHERS, ids=[f[0] for f in FINISHERS])
def test_every_combination_gives_exactly_one_outcome(
    stop_when: str, reason: StopRequest, fname: str, finish: Callable[[Lifecycle], Outcome | None]
) -> None:
    lc = Lifecycle()
    status: str = lc.status
    assert status == "starting"
    stop: StopRequest | None = None
    if stop_when == "before_start":
        assert lc.request_stop(reason) is True
        stop = reason
        assert lc.status == "starting"  # not started yet: not "stopping"
    if fname != "unstarted" or stop_when == "after_start":
        lc.mark_started()
    if stop_when == "after_start":
        status = lc.status
        assert status == "running"
        assert lc.request_stop(reason) is True
        stop = reason
        status = lc.status
        assert status == "stopping"
    started = lc.started

    code: int | None = None
    oom = False
    if fname.startswith("exited"):
        inner = fname.removeprefix("exited(").removesuffix(")")
        code_text, oom_text = inner.split(",oom=")
        code = None if code_text == "None" else int(code_text)
        oom = oom_text == "True"

    outcome = finish(lc)
    want = expected(stop, started, fname, code, oom)
    assert outcome == want
    if want is None:
        assert not lc.ended
        return
    assert lc.ended
    assert lc.outcome == want
    assert lc.status == want.status
    assert outcome is not None
    assert outcome.ran is (fname != "failed")

    # Every later finish_* call loses, and a later stop request is refused.
    for _, again in FINISHERS:
        assert again(lc) is None
    assert lc.request_stop("user_stopped") is False
    assert lc.outcome == want


@pytest.mark.parametrize("reason", STOP_REASONS)
def test_first_stop_request_names_the_reason(reason: StopRequest) -> None:
    lc = Lifecycle()
    lc.mark_started()
    assert lc.request_stop(reason)
    for other in STOP_REASONS:
        assert lc.request_stop(other) is False
    outcome = lc.finish_exited(0, oom_killed=True)
    assert outcome == Outcome("killed", reason, 0)


def test_stop_racing_a_natural_exit_still_reports_the_stop() -> None:
    lc = Lifecycle()
    lc.mark_started()
    lc.request_stop("timeout")
    assert lc.finish_exited(0, oom_killed=False) == Outcome("killed", "timeout", 0)
    assert lc.finish_exited(143, oom_killed=False) is None


def test_finish_unstarted_without_stop_request_is_a_no_op() -> None:
    lc = Lifecycle()
    assert lc.finish_unstarted() is None
    assert lc.outcome is None
    assert lc.status == "starting"
    # the task can still end normally afterwards
    lc.mark_started()
    assert lc.finish_exited(1, oom_killed=False) == Outcome("failed", "exit", 1)


def test_failed_outcome_never_ran() -> None:
    lc = Lifecycle()
    outcome = lc.finish_failed("engine_unavailable", "engine down")
    assert outcome is not None
    assert outcome.ran is False
    assert outcome.reason is None
    assert (outcome.error_code, outcome.error) == ("engine_unavailable", "engine down")


@pytest.mark.parametrize(
    ("reason", "code", "status"),
    [
        ("exit", 0, "completed"),
        ("exit", 1, "failed"),
        ("exit", 137, "failed"),
        ("exit", None, "failed"),
        ("timeout", 0, "killed"),
        ("idle_timeout", 137, "killed"),
        ("user_stopped", None, "killed"),
        ("session_ended", 143, "killed"),
        ("oom_killed", 137, "failed"),
        ("oom_killed", 0, "failed"),
        ("lost", None, "failed"),
    ],
)
def test_status_mapping(reason: str, code: int | None, status: str) -> None:
    assert status_for(reason, code) == status  # type: ignore[arg-type]

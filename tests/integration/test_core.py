"""Core lifecycle against the real engine: output capture, lifetimes, statuses, cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import docker
import pytest

from supervisor import (
    MemorySink,
    PolicyError,
    SpecError,
    Supervisor,
    TaskNotFound,
    TaskNotRunning,
    TaskSpec,
    WaitTimeout,
)
from supervisor.core.events import BaseEvent, parse_event

pytestmark = pytest.mark.timeout(180)


def terminal(events: list[BaseEvent], task_id: str) -> list[BaseEvent]:
    return [e for e in events if e.task_id == task_id and e.type in ("task.stopped", "task.failed")]


async def run_to_end(session: Any, spec: TaskSpec, timeout: float = 60) -> Any:
    info = await session.start(spec)
    return await session.wait(info.task_id, timeout_s=timeout)


def containers_of(sup: Supervisor) -> list[dict[str, Any]]:
    client = docker.APIClient(version="auto")
    rows: list[dict[str, Any]] = client.containers(
        all=True, filters={"label": f"io.sandvisor.owner={sup.instance_id}"}
    )
    return rows


async def test_numbered_lines_exact_and_offset_reads_stitch(sup: Supervisor) -> None:
    session = await sup.open_session("lines")
    info = await run_to_end(
        session, TaskSpec(command="seq 1 100000; printf 'last line without newline'", policy="fast")
    )
    assert info.status == "completed" and info.exit_code == 0
    expected = "".join(f"{i}\n" for i in range(1, 100_001)).encode() + b"last line without newline"
    with open(info.output_path, "rb") as fh:
        assert fh.read() == expected
    assert info.output_bytes == len(expected)
    for limit in (1, 7, 4096, 65536, 1 << 20):
        parts, offset = [], 0
        while True:
            sl = await session.read_output(info.task_id, offset=offset, limit=limit)
            parts.append(sl.data)
            assert sl.next_offset == offset + len(sl.data)
            offset = sl.next_offset
            if sl.eof:
                break
            if limit == 1 and offset > 3000:  # byte-by-byte reads: a prefix is enough
                expected_prefix = expected[:offset]
                assert b"".join(parts) == expected_prefix
                break
        else:  # pragma: no cover
            pass
        if limit != 1:
            assert b"".join(parts) == expected
    assert (await session.tail(info.task_id, chars=25)) == "last line without newline"


async def test_binary_output_survives_byte_for_byte(sup: Supervisor) -> None:
    session = await sup.open_session("binary")
    escapes = "".join(f"\\{b:03o}" for b in range(256))
    info = await run_to_end(session, TaskSpec(command=f"printf '{escapes}'", policy="fast"))
    assert info.status == "completed"
    with open(info.output_path, "rb") as fh:
        assert fh.read() == bytes(range(256))
    sl = await session.read_output(info.task_id, 0, 1000)
    assert sl.data == bytes(range(256)) and sl.eof
    assert sl.lossy and "\ufffd" in sl.text


async def test_stderr_is_merged_in_order(sup: Supervisor) -> None:
    session = await sup.open_session("stderr")
    info = await run_to_end(
        session,
        TaskSpec(command="for i in 1 2 3; do echo out$i; echo err$i >&2; done", policy="fast"),
    )
    with open(info.output_path, "rb") as fh:
        assert fh.read() == b"out1\nerr1\nout2\nerr2\nout3\nerr3\n"


@pytest.mark.parametrize("code", [0, 1, 137])
async def test_exit_codes(sup: Supervisor, code: int) -> None:
    sink = MemorySink()
    session = await sup.open_session(f"exit{code}", sinks=[sink])
    info = await run_to_end(session, TaskSpec(command=f"echo bye; exit {code}", policy="fast"))
    assert info.reason == "exit" and info.exit_code == code
    assert info.status == ("completed" if code == 0 else "failed")
    await session.end()
    (ev,) = terminal(sink.events, info.task_id)
    assert ev.type == "task.stopped" and ev.reason == "exit" and ev.exit_code == code  # type: ignore[attr-defined]


async def test_timeout_fires_and_is_reported(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("timeout", sinks=[sink])
    t0 = time.monotonic()
    info = await run_to_end(session, TaskSpec(command="sleep 100", timeout_ms=1000, policy="fast"))
    elapsed = time.monotonic() - t0
    assert info.status == "killed" and info.reason == "timeout"
    assert 1.0 <= elapsed < 1.0 + 1.0 + 5  # deadline + grace + slack for container start
    await session.end()
    assert len(terminal(sink.events, info.task_id)) == 1


async def test_sigterm_ignorer_ends_by_deadline_plus_grace(sup: Supervisor) -> None:
    session = await sup.open_session("trap")
    info = await session.start(
        TaskSpec(command="trap '' TERM; echo armed; sleep 1000", timeout_ms=1000, policy="fast")
    )
    match = await session.wait_for(info.task_id, "armed", timeout_s=20)
    assert match.line == "armed"
    started = (await session.get(info.task_id)).started_at
    assert started is not None
    final = await session.wait(info.task_id, timeout_s=30)
    assert final.reason == "timeout" and final.exit_code == 137
    assert final.ended_at is not None
    # deadline (1 s) + grace (1 s, policy "fast") + 1 s
    assert final.ended_at - started <= 1.0 + 1.0 + 1.0


async def test_persistent_ignores_timeout_until_stopped(sup: Supervisor) -> None:
    session = await sup.open_session("persistent")
    info = await session.start(
        TaskSpec(command="echo up; sleep 1000", persistent=True, policy="fast")
    )
    assert info.timeout_ms is None and info.persistent
    short = await session.start(TaskSpec(command="sleep 1000", timeout_ms=500, policy="fast"))
    assert (await session.wait(short.task_id, timeout_s=30)).reason == "timeout"
    still = await session.get(info.task_id)
    assert still.status == "running" and still.deadline_at is None
    final = await session.stop(info.task_id)
    assert final.status == "killed" and final.reason == "user_stopped"
    with pytest.raises(TaskNotRunning) as err:
        await session.stop(info.task_id)
    assert err.value.info.reason == "user_stopped"


async def test_user_stop_of_sigterm_ignorer_escalates(sup: Supervisor) -> None:
    session = await sup.open_session("stopkill")
    info = await session.start(
        TaskSpec(command="trap '' TERM; echo ready; sleep 1000", policy="fast")
    )
    await session.wait_for(info.task_id, "ready", timeout_s=20)
    t0 = time.monotonic()
    final = await session.stop(info.task_id)
    assert final.reason == "user_stopped" and final.exit_code == 137
    assert time.monotonic() - t0 <= 1.0 + 1.0  # grace 1 s + 1 s


@pytest.mark.serial(
    "the engine's OOMKilled comes from containerd's TaskOOM event, which on a loaded machine "
    "(three workers) arrived after the exit: the container then reads as a plain exit 137"
)
async def test_oom_is_reported_as_oom_killed(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("oom", sinks=[sink])
    # The shell keeps the whole 200 MB string in memory, far over the 24 MiB limit.
    info = await run_to_end(
        session,
        TaskSpec(
            command="x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}", policy="tiny"
        ),
    )
    assert info.reason == "oom_killed" and info.status == "failed"
    await session.end()
    (ev,) = terminal(sink.events, info.task_id)
    assert ev.reason == "oom_killed"  # type: ignore[attr-defined]


async def test_missing_image_gives_task_failed(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("noimage", sinks=[sink])
    info = await run_to_end(session, TaskSpec(command="echo hi", policy="missingimage"))
    assert info.status == "failed" and info.reason is None
    assert info.error_code == "image_missing" and "sandvisor/does-not-exist" in (info.error or "")
    await session.end()
    (ev,) = terminal(sink.events, info.task_id)
    assert ev.type == "task.failed"
    assert not containers_of(sup)


async def test_errors_for_bad_ids_and_specs(sup: Supervisor) -> None:
    session = await sup.open_session("errors")
    with pytest.raises(TaskNotFound):
        await session.get("bg-00000000")
    with pytest.raises(SpecError, match="timeout_ms"):
        await session.start({"command": "true", "timeout_ms": 3_600_001})
    with pytest.raises(SpecError, match="bogus: unknown field"):
        await session.start({"command": "true", "bogus": 1})
    with pytest.raises(SpecError, match=r"allowed: 1\.\.1000"):
        await session.start({"command": "true", "timeout_ms": 5000, "policy": "strict"})
    with pytest.raises(PolicyError, match=r"known policies: .*default"):
        await session.start({"command": "true", "policy": "nope"})
    with pytest.raises(SpecError, match="persistent"):
        await session.start({"command": "true", "persistent": True, "policy": "strict"})
    assert await session.list() == []


async def test_output_cap_drops_with_record_and_task_keeps_running(sup: Supervisor) -> None:
    session = await sup.open_session("cap")
    info = await run_to_end(
        session,
        TaskSpec(
            command="head -c 100000 /dev/zero | tr '\\0' x; echo; echo still-alive >/tmp/f; cat /tmp/f",
            policy="fast",
            limits={"output_cap_bytes": 4096},
        ),
    )
    assert info.status == "completed"
    assert info.output_bytes == 4096
    assert info.dropped_bytes == 100000 + 1 + len("still-alive\n") - 4096
    with open(info.output_path, "rb") as fh:
        data = fh.read()
    assert data.startswith(b"x" * 4096)
    assert b"output cap of 4096 bytes reached" in data
    assert f"{info.dropped_bytes} bytes of output were dropped".encode() in data


async def test_terminal_event_is_stored_before_wait_and_stop_return(sup: Supervisor) -> None:
    # A reader right after wait()/stop() (another process reading the store, a long-poll)
    # must find the terminal event; it used to be still queued for the store.
    session = await sup.open_session("wait-then-read")
    for round_ in range(10):
        quick = await session.start(TaskSpec(command="true", policy="fast"))
        done = await session.wait(quick.task_id, timeout_s=60)
        long = await session.start(TaskSpec(command="sleep 60", policy="fast"))
        stopped = await session.stop(long.task_id)
        assert (done.status, stopped.reason) == ("completed", "user_stopped"), round_
        rows = [parse_event(r) for r in await sup.store.read_events(session.session_id, 0, 10_000)]
        for task_id in (quick.task_id, long.task_id):
            assert [e.type for e in terminal(rows, task_id)] == ["task.stopped"], (round_, task_id)


async def test_wait_timeout_and_input(sup: Supervisor) -> None:
    session = await sup.open_session("input")
    info = await session.start(TaskSpec(command="read line; echo got:$line; cat", policy="fast"))
    with pytest.raises(WaitTimeout):
        await session.wait(info.task_id, timeout_s=0.3)
    await session.send_input(info.task_id, "hello\n")
    await session.wait_for(info.task_id, "^got:hello$", timeout_s=10)
    await session.send_input(info.task_id, "more\n", eof=True)
    final = await session.wait(info.task_id, timeout_s=10)
    assert final.status == "completed"
    with open(final.output_path, "rb") as fh:
        assert fh.read() == b"got:hello\nmore\n"


async def test_races_give_exactly_one_terminal_event(sup: Supervisor) -> None:
    """200 stop-vs-exit and 200 session-end-vs-exit races."""
    sink = MemorySink()
    session = await sup.open_session("races", sinks=[sink])
    rng = random.Random(7)

    async def stop_race() -> str:
        info = await session.start(TaskSpec(command="sleep 0.3", policy="fast"))
        await sink.wait_for(lambda e: e.type == "task.started" and e.task_id == info.task_id)
        await asyncio.sleep(rng.uniform(0.2, 0.4))
        with contextlib.suppress(TaskNotRunning):
            await session.stop(info.task_id)
        return info.task_id

    async def end_race(i: int) -> tuple[MemorySink, str]:
        own = MemorySink()
        s = await sup.open_session(f"endrace-{i}", sinks=[own])
        info = await s.start(TaskSpec(command="sleep 0.3", policy="fast"))
        await own.wait_for(lambda e: e.type == "task.started")
        await asyncio.sleep(rng.uniform(0.2, 0.4))
        await s.end()
        return own, info.task_id

    ids: list[str] = []
    for _ in range(10):
        ids += await asyncio.gather(*(stop_race() for _ in range(20)))
    ends: list[tuple[MemorySink, str]] = []
    for batch in range(10):
        ends += await asyncio.gather(*(end_race(batch * 20 + i) for i in range(20)))
    await session.end()
    reasons: dict[str, int] = {}
    for tid in ids:
        evs = terminal(sink.events, tid)
        assert len(evs) == 1, (tid, evs)
        reasons[evs[0].reason] = reasons.get(evs[0].reason, 0) + 1  # type: ignore[attr-defined]
    for own, tid in ends:
        evs = terminal(own.events, tid)
        assert len(evs) == 1, (tid, evs)
        assert own.events[-1].type == "session.ended"
        reasons[evs[0].reason] = reasons.get(evs[0].reason, 0) + 1  # type: ignore[attr-defined]
    # Both sides of each race really happened.
    assert reasons.get("exit", 0) > 0 and reasons.get("user_stopped", 0) > 0
    assert reasons.get("session_ended", 0) > 0
    assert not containers_of(sup)


async def test_session_end_with_50_running_tasks(sup: Supervisor) -> None:
    sink = MemorySink()
    session = await sup.open_session("fifty", sinks=[sink])
    infos = []
    for i in range(50):
        cmd = "trap '' TERM; echo up; sleep 1000" if i % 2 else "echo up; sleep 1000"
        infos.append(await session.start(TaskSpec(command=cmd, policy="fast")))
    for info in infos:
        await session.wait_for(info.task_id, "up", timeout_s=60)
    t0 = time.monotonic()
    await session.end()
    elapsed = time.monotonic() - t0
    # The 25 tasks that ignore SIGTERM each wait out the 1 s grace before SIGKILL. Ended
    # one after another that is 25 s or more; the graces overlap, so it is about one. The
    # bound is a quarter of the serial time, so that a loaded machine does not move it.
    assert elapsed < 25 * 1.0 / 4, elapsed
    seqs = [e.seq for e in sink.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert sink.events[-1].type == "session.ended"
    for info in infos:
        (ev,) = terminal(sink.events, info.task_id)
        assert ev.reason == "session_ended"  # type: ignore[attr-defined]
    assert not containers_of(sup)
    await session.end()  # idempotent


class SlowSink:
    """Sleeps a second per event."""

    def __init__(self) -> None:
        self.events: list[BaseEvent] = []
        self.got_gap = asyncio.Event()

    async def send(self, event: BaseEvent) -> None:
        await asyncio.sleep(1.0)
        self.events.append(event)
        if event.type == "events.gap":
            self.got_gap.set()

    async def aclose(self) -> None:
        return None


async def test_slow_sink_never_blocks_capture(state_dir: Any, policies_dir: Any) -> None:
    from tests.conftest import require_engine  # noqa: PLC0415

    require_engine()
    (policies_dir / "chatty.toml").write_text(
        'image = "sandvisor/minimal:latest"\nworking_dir = "/tmp"\n'
        "[monitor]\nbatch_window_ms = 0\nlines_per_s = 1000000\nburst_lines = 1000000\n"
        "bytes_per_s = 1000000000\nburst_bytes = 1000000000\n"
        "max_chunk_bytes = 65536\n"
    )
    async with Supervisor(
        state_dir=state_dir,
        policies_dir=policies_dir,
    ) as sup:
        slow, fast = SlowSink(), MemorySink()
        session = await sup.open_session("slow", sinks=[fast])
        session.add_sink(slow, max_lag=8)
        info = await session.start(
            TaskSpec(
                command="yes 0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghij | head -c 50000000",
                kind="monitor",
                policy="chatty",
            )
        )
        final = await session.wait(info.task_id, timeout_s=120)
        assert final.status == "completed"
        assert final.output_bytes == 50_000_000
        with open(final.output_path, "rb") as fh:
            fh.seek(0, 2)
            assert fh.tell() == 50_000_000
        # The slow sink is far behind while the fast one already has the terminal event.
        await fast.wait_for(lambda e: e.type == "task.stopped")
        outputs = [e for e in fast.events if e.type == "task.output"]
        assert len(outputs) > 100
        # The slow sink takes a second per event. Had capture waited for it, the task
        # could not have finished before the slow sink had seen its output events; it
        # finished with the slow sink a small fraction of the way through them.
        assert len(slow.events) < len(outputs) / 5, (len(slow.events), len(outputs))
        text = "".join(e.text + ("\n" if e.eol else "") for e in outputs)  # type: ignore[attr-defined]
        assert len(text) == 50_000_000
        await asyncio.wait_for(slow.got_gap.wait(), 60)
        await session.end()
        gaps = [e for e in slow.events if e.type == "events.gap"]
        assert gaps[0].first_seq <= gaps[0].last_seq  # type: ignore[attr-defined]
        assert all(e.type != "events.gap" for e in fast.events)
        seqs = [e.seq for e in fast.events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


async def test_input_sent_while_starting_reaches_the_command(sup: Supervisor) -> None:
    session = await sup.open_session("early-input")
    info = await session.start(TaskSpec(command="read x; echo got:$x", policy="fast"))
    assert info.status == "starting"
    await session.send_input(info.task_id, "early\n")
    match = await session.wait_for(info.task_id, "^got:", timeout_s=30)
    assert match.line == "got:early"


async def test_aclose_leaves_no_thread_or_task_behind(state_dir: Any, policies_dir: Any) -> None:
    import threading  # noqa: PLC0415

    from tests.conftest import require_engine  # noqa: PLC0415

    require_engine()
    before = {t.name for t in threading.enumerate()}
    async with Supervisor(state_dir=state_dir, policies_dir=policies_dir) as sup:
        session = await sup.open_session("close")
        info = await session.start(TaskSpec(command="echo x; sleep 100", policy="fast"))
        await session.wait_for(info.task_id, "x", timeout_s=30)
        busy = {t.name for t in threading.enumerate()} - before
        assert any(n.startswith("sandvisor-") for n in busy)  # our pools were in use
    left = {t.name for t in threading.enumerate() if t.is_alive()} - before
    assert not [n for n in left if n.startswith("sandvisor-")], left
    current = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert pending == [], pending

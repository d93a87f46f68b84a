"""workspace-start: what a session's workspace adds to a task's start. ``session.start()`` ->
first output byte in a session with an overlay workspace, against the same in a session
without one (and a read-only bind, for scale), interleaved sample by sample; cold and from
the warm pool. Plus opening a session on a project (its manifest) and its first task (the
overlay volume is created and mounted then)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.common import Ctx, Progress, Result, row, say
from bench.start import COMMAND, _ours, _refilled
from supervisor.core.workspace import WorkspaceSpec
from supervisor.runtime.session import Session

NAME = "workspace-start"
TITLE = "start -> first byte with an overlay workspace vs none (echo x, sandvisor/minimal)"
#: The workspace's cost on a task start may be at most this much (p50, paired samples).
TARGET_MS = 15.0
#: uid:gid of the project (an ordinary user's, as on a developer's machine).
OWNER = (1000, 1000)


def _project(root: Path, files: int) -> Path:
    """A small source tree: ``files`` files in directories of 20, owned by OWNER."""
    project = root / "proj"
    for i in range(files):
        d = project / f"pkg{i // 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i % 20}.py").write_text(f"X = {i}\n")
    (project / "README.md").write_text("bench\n")
    if os.geteuid() == 0:
        for dirpath, dirs, names in os.walk(project):
            for name in dirs + names:
                os.lchown(os.path.join(dirpath, name), *OWNER)
        os.lchown(project, *OWNER)
    return project


def _paired_delta(ours: list[float], base: list[float]) -> list[float]:
    """Per pair (taken one right after the other): ours - base, in ms."""
    return [(a - b) * 1000 for a, b in zip(ours, base, strict=False)]


async def _open_cost(ctx: Ctx, project: Path, rounds: int, res: Result) -> None:
    """Opening a session on the project, and its first task (volume create + mount)."""
    opened: list[float] = []
    plain: list[float] = []
    first: list[float] = []
    later: list[float] = []
    async with ctx.supervisor("ws-open", workspace_roots=[project.parent]) as sup:
        for i in range(rounds):
            t0 = time.perf_counter()
            bare = await sup.open_session(f"bench-plain-{i}")
            plain.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            session = await sup.open_session(
                f"bench-open-{i}", workspace=WorkspaceSpec(path=str(project))
            )
            opened.append((time.perf_counter() - t0) * 1000)
            first.append(await _ours(session, "bench") * 1000)
            later.append(await _ours(session, "bench") * 1000)
            await session.end()
            await bare.end()
    files = sum(len(f) for _, _, f in os.walk(project))
    res.rows.append(
        row(
            f"open_session with an overlay workspace ({files} files)",
            "ms",
            opened,
            baseline="open_session without one",
            base=plain,
        )
    )
    res.rows.append(
        row(
            "  its first task -> first byte (volume made)",
            "ms",
            first,
            baseline="its second task",
            base=later,
        )
    )
    res.samples.update(
        {"open_ws_ms": opened, "open_plain_ms": plain, "first_ms": first, "second_ms": later}
    )


async def _interleaved(
    sessions: dict[str, Session],
    policy: str,
    n: int,
    warmup: int,
    errors: dict[str, int],
    label: str,
) -> dict[str, list[float]]:
    """n samples of each session, one after the other in each round."""
    out: dict[str, list[float]] = {k: [] for k in sessions}
    prog = Progress(f"workspace-start: {label}", n)
    warm = policy != "bench"
    keys = list(sessions)
    for i in range(warmup + n):
        row_values: dict[str, float] = {}
        # The order rotates each round (ABC, BCA, CAB): no session always goes first.
        order = keys[i % len(keys) :] + keys[: i % len(keys)]
        for key in order:
            session = sessions[key]
            if warm:
                await _refilled(session, policy)
            try:
                row_values[key] = await _ours(session, policy)
            except Exception as exc:
                errors[f"{label}-{key}"] = errors.get(f"{label}-{key}", 0) + 1
                say(f"{label} {key} sample failed: {exc!r}")
        # Keep only complete rounds, so deltas stay paired.
        if i >= warmup and len(row_values) == len(sessions):
            for key, value in row_values.items():
                out[key].append(value)
            prog.step(extra=" ".join(f"{k} {row_values[k] * 1000:.1f} ms" for k in keys))
    return out


def _rows(res: Result, label: str, samples: dict[str, list[float]]) -> None:
    none_ms = [v * 1000 for v in samples["none"]]
    for key, what in (("overlay", "overlay workspace"), ("ro", "read-only bind")):
        ms = [v * 1000 for v in samples[key]]
        res.rows.append(
            row(f"{label}: {what} -> first byte", "ms", ms, baseline="no workspace", base=none_ms)
        )
    delta = _paired_delta(samples["overlay"], samples["none"])
    r = row(
        f"{label}: overlay - none, paired",
        "ms",
        delta,
        target=f"p50 <= +{TARGET_MS:.0f} ms",
    )
    if delta:
        r.passed = r.ours["p50"] <= TARGET_MS
    res.rows.append(r)
    ro_delta = _paired_delta(samples["ro"], samples["none"])
    res.rows.append(row(f"{label}: ro bind - none, paired", "ms", ro_delta))
    res.samples[f"{label}_ro_delta_ms"] = ro_delta
    res.samples[f"{label}_none_ms"] = none_ms
    res.samples[f"{label}_overlay_ms"] = [v * 1000 for v in samples["overlay"]]
    res.samples[f"{label}_ro_ms"] = [v * 1000 for v in samples["ro"]]
    res.samples[f"{label}_delta_ms"] = delta


async def run(ctx: Ctx) -> Result:
    n = 5 if ctx.quick else 40
    warmup = 1 if ctx.quick else 3
    files = 200 if ctx.quick else 2000
    res = Result(NAME, TITLE)
    res.config = {
        "n": n,
        "warmup_discarded": warmup,
        "command": COMMAND,
        "policies": ["bench", "bench-warm"],
        "project_files": files,
        "project_owner": list(OWNER) if os.geteuid() == 0 else "the bench's user",
    }
    errors: dict[str, int] = {}
    base = ctx.scratch("ws-start")
    project = _project(base, files)
    async with ctx.supervisor(NAME, workspace_roots=[base]) as sup:
        sessions = {
            "none": await sup.open_session("bench-ws-none"),
            "overlay": await sup.open_session(
                "bench-ws-overlay", workspace=WorkspaceSpec(path=str(project))
            ),
            "ro": await sup.open_session(
                "bench-ws-ro", workspace=WorkspaceSpec(path=str(project), mode="ro")
            ),
        }
        cold = await _interleaved(sessions, "bench", n, warmup, errors, "cold")
        for session in sessions.values():
            say(f"{session.session_id}: warm pool {await session.prewarm('bench-warm')} ready")
        warm = await _interleaved(sessions, "bench-warm", n, warmup, errors, "warm")
        for session in sessions.values():
            await session.end()
    _rows(res, "cold", cold)
    _rows(res, "warm", warm)
    await _open_cost(ctx, project, 2 if ctx.quick else 10, res)
    res.errors = errors
    res.notes.append(
        "Three sessions of one supervisor (no workspace, overlay, ro bind of the same project), "
        "sampled one after the other in each round, so load changes hit all three alike; the "
        "delta row is the per-round difference overlay - none. Tasks in a workspace run in it "
        "(working dir = the project's path) as its owner (uid 1000); without one, in the "
        "policy's /tmp as 65534. The overlay volume is made and mounted by the engine on a "
        "session's first task and unmounted when its last container goes, so every cold "
        "sample mounts it afresh; warm containers hold it while they wait. The pool is per "
        "session and per policy (prewarm on each of the three sessions)."
    )
    return res

"""Readiness checks: engine, runtimes (and whether runsc really starts), images, state dir."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from supervisor.core.engine_versions import DEADLOCK_NOTE, deadlock_prone
from supervisor.core.errors import SupervisorError
from supervisor.core.policy import PolicySet, default_policies_dir
from supervisor.engine.base import Backend
from supervisor.engine.endpoint import DEFAULT_SOCKET, docker_host
from supervisor.engine.probe import probe_runtime
from supervisor.tooling.doctor_model import Check, CheckStatus, _Model
from supervisor.tooling.engine_owner import engine_run_dir, identify
from supervisor.tooling.images import IMAGES, repository, root_cause, source_hash
from supervisor.tooling.swarm_doctor import node_checks

_NO_ENGINE = "not checked: the engine does not answer"


class Report(_Model):
    """Every check, and whether the supervisor can run tasks."""

    ready: bool
    """True when no check failed: engine answers, runc works, images present, state writable."""
    checks: list[Check]
    """In a fixed order: engine, runtimes, images, state dir, policies."""

    def get(self, name: str) -> Check | None:
        """The check called ``name``, if it ran."""
        return next((c for c in self.checks if c.name == name), None)

    def failures(self) -> list[Check]:
        """The checks with status ``fail``."""
        return [c for c in self.checks if c.status == "fail"]


async def _check_engine(backend: Backend) -> Check:
    host = docker_host()
    try:
        info = await backend.ping()
    except SupervisorError as exc:
        cause = root_cause(exc)
        if "permission denied" in cause.lower():
            return Check(
                name="engine",
                status="fail",
                detail=f"the Docker engine at {host} refuses this user ({cause}): join the "
                "docker group, then log in again",
                facts={"host": host, "reachable": False, "error": str(exc)},
                fix='sudo usermod -aG docker "$USER"',
            )
        owner = await asyncio.to_thread(identify, host, engine_run_dir())
        if owner.kind == "not_ours" and host == f"unix://{DEFAULT_SOCKET}":
            fix: str | None = "sudo systemctl start docker"
        elif owner.kind == "not_ours":
            fix = None  # another DOCKER_HOST is someone else's to start
        else:  # engine.sh's dockerd is running (root is needed to be sure): restart it
            fix = f"{'' if os.geteuid() == 0 else 'sudo '}sandvisor doctor --fix-engine"
        return Check(
            name="engine",
            status="fail",
            detail=f"no Docker engine answers at {host} ({cause}): is dockerd "
            "running? is DOCKER_HOST right?",
            facts={"host": host, "reachable": False, "error": str(exc)},
            fix=fix,
        )
    detail = f"Docker {info['version']} (API {info['api_version']}) at {host}"
    facts = {"host": host, "reachable": True, **info}
    if deadlock_prone(info["version"]):
        owner = await asyncio.to_thread(identify, host, engine_run_dir())
        return Check(
            name="engine",
            status="warn",
            detail=f"{detail}: {DEADLOCK_NOTE}",
            facts={**facts, "known_deadlocks": True},
            # `make engine` upgrades only when it starts an engine: stop its own one first.
            fix="make engine-down && make engine" if owner.ours else None,
        )
    return Check(name="engine", status="ok", detail=detail, facts=facts)


async def _check_runtime(
    backend: Backend,
    runtime: str,
    registered: set[str],
    policies: PolicySet | None,
    *,
    probe: bool,
) -> Check:
    name = f"runtime {runtime}"
    users = sorted(p.name for p in policies.all() if p.runtime == runtime) if policies else []
    # runc is required; runsc only gates the policies that ask for it, so it only warns.
    bad: CheckStatus = "fail" if runtime == "runc" else "warn"
    facts: dict[str, Any] = {"registered": runtime in registered, "policies": users}
    who = f"the {', '.join(users)} polic{'y' if len(users) == 1 else 'ies'}" if users else ""
    cannot = f"; {who} cannot run" if who else ""
    if runtime not in registered:
        hint = (
            " (install it and register it in /etc/docker/daemon.json)" if runtime == "runsc" else ""
        )
        return Check(
            name=name,
            status=bad,
            detail=f"not registered with the engine{hint}{cannot}",
            facts={**facts, "probed": False, "starts": None},
        )
    if not probe:
        return Check(
            name=name,
            status="ok",
            detail="registered (not probed)",
            facts={**facts, "probed": False, "starts": None},
        )
    why = await probe_runtime(backend, runtime, policies)
    if why is None:
        can = f"; {who} can run" if who else "; no policy uses it yet"
        return Check(
            name=name,
            status="ok",
            detail=f"registered; a probe container ran{can}",
            facts={**facts, "probed": True, "starts": True},
        )
    if why.startswith("no image to probe with"):
        return Check(
            name=name,
            status="warn",
            detail=f"registered; not probed: {why}",
            facts={**facts, "probed": False, "starts": None, "error": why},
        )
    return Check(
        name=name,
        status=bad,
        detail=f"registered, but a probe container failed: {why}{cannot}",
        facts={**facts, "probed": True, "starts": False, "error": why},
    )


async def _check_image(backend: Backend, name: str) -> Check:
    repo = repository(name)
    latest = await backend.image_id(f"{repo}:latest")
    try:
        wanted: str | None = await asyncio.to_thread(source_hash, name)
    except SupervisorError:
        # Installed without the sandbox_images/ sources: presence is all we can tell.
        wanted = None
    facts: dict[str, Any] = {
        "present": latest is not None,
        "image_id": latest,
        "source_hash": wanted,
        "tag": f"{repo}:{wanted}" if wanted else None,
    }
    if latest is None:
        return Check(
            name=f"image {name}",
            status="fail",
            detail=f"{repo}:latest is missing (images are built here, never pulled): "
            f"run `sandvisor images build {name}`",
            facts={**facts, "up_to_date": False},
            fix=f"sandvisor images build {name}",
        )
    short = latest.removeprefix("sha256:")[:12]
    if wanted is None:
        return Check(
            name=f"image {name}",
            status="ok",
            detail=f"{repo}:latest ({short}); sources not found, freshness unknown",
            facts={**facts, "up_to_date": None},
        )
    current = await backend.image_id(f"{repo}:{wanted}")
    if current != latest:
        return Check(
            name=f"image {name}",
            status="warn",
            detail=f"{repo}:latest ({short}) was built from older sources: "
            f"run `sandvisor images build {name}`",
            facts={**facts, "up_to_date": False},
            fix=f"sandvisor images build {name}",
        )
    return Check(
        name=f"image {name}",
        status="ok",
        detail=f"{repo}:{wanted} ({short}), up to date",
        facts={**facts, "up_to_date": True},
    )


def _probe_state_dir(path: Path) -> dict[str, Any]:
    existed = path.is_dir()
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".sandvisor-doctor-") as handle:
        handle.write(b"ok\n")
        handle.flush()
        os.fsync(handle.fileno())
    return {"created": not existed, "free_bytes": shutil.disk_usage(path).free}


async def _check_state_dir(path: Path) -> Check:
    try:
        facts = await asyncio.to_thread(_probe_state_dir, path)
    except OSError as exc:
        return Check(
            name="state dir",
            status="fail",
            detail=f"{path} is not writable: {exc.strerror or exc}",
            facts={"path": str(path), "writable": False, "error": str(exc)},
        )
    free_gib = facts["free_bytes"] / 1024**3
    created = " (created)" if facts["created"] else ""
    return Check(
        name="state dir",
        status="ok",
        detail=f"{path} is writable{created}, {free_gib:.1f} GiB free",
        facts={"path": str(path), "writable": True, **facts},
    )


def _read_policies(directory: Path | None) -> tuple[Path | None, PolicySet]:
    directory = directory or default_policies_dir()
    return directory, PolicySet.load(directory)


async def _load_policies(directory: Path | None) -> tuple[PolicySet | None, Check]:
    try:
        directory, policies = await asyncio.to_thread(_read_policies, directory)
    except SupervisorError as exc:
        return None, Check(
            name="policies",
            status="fail",
            detail=str(exc).replace("\n", " "),
            facts={"directory": str(directory) if directory else None, "error": str(exc)},
        )
    sources = policies.sources()
    facts = {
        "directory": str(directory) if directory else None,
        "shipped": str(policies.shipped) if policies.shipped else None,
        "names": policies.names(),
    }
    if policies.shipped is None:
        return policies, Check(
            name="policies",
            status="warn",
            detail="the shipped policies are not installed with this copy of sandvisor, "
            f"only {', '.join(policies.names())}: reinstall it from its wheel",
            facts=facts,
            fix="pip install --force-reinstall sandbox-supervisor",
        )
    where = " from " + " + ".join(str(s) for s in sources) if sources else " (built-in only)"
    return policies, Check(
        name="policies",
        status="ok",
        detail=f"{', '.join(policies.names())}{where}",
        facts=facts,
    )


async def run_checks(
    backend: Backend | None = None,
    *,
    state_dir: Path,
    policies: PolicySet | None = None,
    policies_dir: Path | None = None,
    probe: bool = True,
    images: Sequence[str] = IMAGES,
) -> Report:
    """Check everything the supervisor needs. Never raises for an unhealthy host.

    Without ``backend`` a DockerBackend for ``DOCKER_HOST`` is opened and closed here.
    Without ``policies`` they are loaded: the shipped ones, then ``policies_dir``.
    ``probe`` starts a throwaway container per runtime to prove it really works.
    """
    if policies is None:
        policies, policy_check = await _load_policies(policies_dir)
    else:
        policy_check = Check(
            name="policies",
            status="ok",
            detail=", ".join(policies.names()),
            facts={"names": policies.names()},
        )
    own = backend is None
    if backend is None:
        from supervisor.engine.select import make_backend  # noqa: PLC0415 - loads docker-py

        try:
            backend = make_backend(None)
        except SupervisorError as exc:
            engine = Check(
                name="engine",
                status="fail",
                detail=f"cannot use DOCKER_HOST={docker_host()}: {exc}",
                facts={"host": docker_host(), "reachable": False, "error": str(exc)},
            )
            return _report(
                [engine, *_unchecked(images), await _check_state_dir(state_dir), policy_check]
            )
    try:
        engine = await _check_engine(backend)
        if engine.status == "fail":
            checks = [engine, *_unchecked(images)]
        else:
            checks = [
                engine,
                *await node_checks(backend),
                *await _engine_checks(backend, policies, images, probe=probe),
            ]
        checks += [await _check_state_dir(state_dir), policy_check]
        return _report(checks)
    finally:
        if own:
            await backend.aclose()


async def _engine_checks(
    backend: Backend, policies: PolicySet | None, images: Sequence[str], *, probe: bool
) -> list[Check]:
    try:
        registered = await backend.runtimes()
    except SupervisorError as exc:
        registered = set()
        listing_error: str | None = str(exc)
    else:
        listing_error = None
    runtime_checks = []
    for runtime in ("runc", "runsc"):
        bad: CheckStatus = "fail" if runtime == "runc" else "warn"
        if listing_error is not None:
            runtime_checks.append(
                Check(
                    name=f"runtime {runtime}",
                    status=bad,
                    detail=f"cannot list runtimes: {listing_error}",
                )
            )
            continue
        check = _check_runtime(backend, runtime, registered, policies, probe=probe)
        runtime_checks.append(await _guarded(f"runtime {runtime}", bad, check))
    image_checks = [await _guarded(f"image {n}", "fail", _check_image(backend, n)) for n in images]
    return [*runtime_checks, *image_checks]


async def _guarded(name: str, status: CheckStatus, check: Awaitable[Check]) -> Check:
    """A check whose engine calls fail midway (engine stopped during doctor) still reports."""
    try:
        return await check
    except SupervisorError as exc:
        return Check(name=name, status=status, detail=f"engine error: {exc}")


def _unchecked(images: Sequence[str]) -> list[Check]:
    return [
        Check(name="runtime runc", status="fail", detail=_NO_ENGINE),
        Check(name="runtime runsc", status="warn", detail=_NO_ENGINE),
        *(Check(name=f"image {n}", status="fail", detail=_NO_ENGINE) for n in images),
    ]


def one_fix(report: Report) -> str | None:
    """The one command that fixes the first failure (or, when ready, the first warning):
    ``sandvisor images build`` (all of them) when several images are missing."""
    for status in ("fail", "warn"):
        bad = [c for c in report.checks if c.status == status]
        if not bad:
            continue
        if bad[0].name == "engine":
            return bad[0].fix
        builds = [c for c in bad if c.fix and c.fix.startswith("sandvisor images build ")]
        if len(builds) > 1 and bad[0] in builds:
            return "sandvisor images build"
        return next((c.fix for c in bad if c.fix), None)
    return None


def _report(checks: list[Check]) -> Report:
    return Report(ready=all(c.status != "fail" for c in checks), checks=checks)

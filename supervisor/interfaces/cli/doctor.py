"""``sandvisor doctor``: is this host ready to run sandboxed tasks? Exit 0 only when it is."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from supervisor.core.paths import default_state_dir
from supervisor.interfaces.cli.common import HelpFormatter, fail, print_json, print_table

EPILOG = """\
Checks: the engine answers (honours DOCKER_HOST; on a Swarm, every node: its engine from
the io.sandvisor.engine label, whether it answers as that node, its default runtime and labels);
runc and runsc are registered and a probe container really starts under each; the sandbox
images are present and built from the current sources; the state directory is writable;
the policy files load.
runsc missing or broken is a warning (only the policies that ask for gVisor cannot run);
a stale image is a warning; everything else that is not ok fails.

--fix-engine: when the engine does not answer or is wedged (a ping not answered within
1.5 s, a container listing not within 3 s), restart it, but only the dockerd that
scripts/engine.sh (`make engine`) started: the one its pid file
($SANDVISOR_ENGINE_RUN_DIR/dockerd.pid, default /var/run/sandvisor-engine) names, whose
/proc/<pid>/cmdline is dockerd and which listens at DOCKER_HOST's socket. It is stopped
(SIGTERM, SIGKILL after 30 s) and started again with the command line it was started with,
then the checks run. Any other engine (systemd's, one elsewhere) is left alone, and doctor
says what to do instead. Needs root.

exit status: 0 ready, 1 not ready (or --fix-engine refused or failed)

examples:
  sandvisor doctor
  sandvisor doctor --json | jq '.checks[] | select(.status != "ok")'
  DOCKER_HOST=unix:///run/other.sock sandvisor doctor --no-probe
  sandvisor doctor --backend swarm --docker-host unix:///run/sandvisor-swarm-lab/n1.sock --no-probe
  sudo sandvisor doctor --fix-engine
"""


def _doctor(args: argparse.Namespace) -> int:
    # Here, not at the top: it loads the docker SDK, which no other command needs at start.
    from supervisor.tooling.doctor import one_fix, run_checks  # noqa: PLC0415

    if args.backend:
        os.environ["SANDVISOR_BACKEND"] = args.backend  # read where the backend is made
    if args.docker_host:
        os.environ["DOCKER_HOST"] = args.docker_host
    fixed: dict[str, Any] | None = None
    if args.fix_engine:
        outcome = _fix_engine(args)
        if isinstance(outcome, int):
            return outcome
        fixed = outcome
    state_dir = args.state_dir or default_state_dir()
    report = asyncio.run(
        run_checks(state_dir=state_dir, policies_dir=args.policies_dir, probe=not args.no_probe)
    )
    if args.json:
        print_json({**report.model_dump(mode="json"), **({"engine_fix": fixed} if fixed else {})})
    else:
        print_table(
            ["check", "status", "detail"], [[c.name, c.status, c.detail] for c in report.checks]
        )
        if sys.stdout.isatty():
            sys.stdout.write("ready\n" if report.ready else "not ready\n")
    fix = one_fix(report)
    if fix and not args.json:
        sys.stdout.write(f"to fix: {fix}\n")
    if report.ready:
        return 0
    failed = report.failures()
    first = failed[0]
    # Without an engine the other failures are consequences, not news.
    others = 0 if first.name == "engine" else len(failed) - 1
    more = f" (and {others} more failed checks)" if others else ""
    then = f"; to fix: {fix}" if fix else ""
    return fail(f"not ready: {first.name}: {first.detail}{more}{then}")


def _fix_engine(args: argparse.Namespace) -> dict[str, Any] | int:
    """Restart engine.sh's engine when it is down or wedged: what was done (the checks
    follow), or the exit status when it was refused or failed."""
    from supervisor.engine.select import backend_kind  # noqa: PLC0415
    from supervisor.tooling.engine_fix import fix_engine  # noqa: PLC0415

    if backend_kind() != "docker":
        return fail(
            "--fix-engine restarts this host's own engine, not a Swarm: run it on the node "
            "whose engine is wedged, with --backend docker"
        )
    outcome = asyncio.run(fix_engine())
    done = outcome.model_dump(mode="json")
    if outcome.action in ("none", "restarted"):
        sys.stderr.write(f"engine: {outcome.message}\n")
        return done
    if args.json:
        print_json({"engine_fix": done})
    todo = f"; to fix: {outcome.todo}" if outcome.todo else ""
    return fail(f"{outcome.message}{todo}")


def register(subparsers: Any) -> None:
    """Add ``sandvisor doctor``."""
    parser = subparsers.add_parser(
        "doctor",
        help="check the engine, runtimes, images and state dir",
        description="Check whether this host can run sandboxed tasks, and say what to fix.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="state directory to check (default: $SANDVISOR_STATE_DIR or ~/.local/state/sandvisor)",
    )
    parser.add_argument(
        "--policies-dir",
        type=Path,
        default=None,
        help="policy files that override or add to the shipped ones "
        "(default: $SANDVISOR_POLICIES_DIR)",
    )
    parser.add_argument(
        "--no-probe",
        action="store_true",
        help="only ask the engine which runtimes exist; do not start probe containers",
    )
    parser.add_argument(
        "--backend",
        choices=["docker", "swarm"],
        default=None,
        help=(
            "one Docker engine, or a Swarm through its manager"
            " (default: $SANDVISOR_BACKEND, docker)"
        ),
    )
    parser.add_argument(
        "--docker-host",
        default=None,
        help="the engine, or the Swarm manager (default: $DOCKER_HOST)",
    )
    parser.add_argument(
        "--fix-engine",
        action="store_true",
        help="when the engine does not answer or is wedged, restart it first: only the "
        "dockerd that scripts/engine.sh (`make engine`) started, found by its pid file "
        "($SANDVISOR_ENGINE_RUN_DIR/dockerd.pid); any other engine is left alone (root)",
    )
    parser.set_defaults(func=_doctor)

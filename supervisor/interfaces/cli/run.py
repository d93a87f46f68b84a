"""``sandvisor run``: start a command in a fresh sandbox, in the foreground or in the background."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from supervisor.core.errors import StdinClosed, SupervisorError, TaskNotRunning
from supervisor.core.text import end_clause
from supervisor.interfaces.cli.common import (
    HelpFormatter,
    duration_ms,
    duration_s,
    print_json,
    want_plain,
)
from supervisor.interfaces.cli.project import add_workspace_options, open_run_session
from supervisor.interfaces.cli.remote import (
    CliError,
    add_daemon_options,
    call,
    error_message,
    wait_started,
)

if TYPE_CHECKING:
    from supervisor.interfaces.client import SandvisorClient, TaskJson

#: Exit statuses in the foreground, as timeout(1) and docker run use them.
EXIT_TIMEOUT = 124
EXIT_START_FAILED = 125
EXIT_KILLED = 137

EPILOG = f"""\
In the foreground (the default) the output is streamed to stdout as it arrives, this
program's stdin is forwarded to the command (EOF when it ends; --stdin closed gives EOF
at once), and sandvisor exits with the command's exit code: {EXIT_TIMEOUT} when the timeout
stopped it, {EXIT_KILLED} when it was killed (stopped, session ended, out of memory, lost),
{EXIT_START_FAILED} when it never started (the reason is on stderr). Ctrl-C stops the task
and exits 130. Ctrl-Z detaches: the task keeps running in its session, sandvisor prints its id
and how to follow it (sandvisor logs -f ID, sandvisor wait ID, sandvisor stop ID) and exits 0.

With --bg or --monitor the task keeps running after sandvisor returns: it prints the task id and
the output file (two plain lines when piped, the TaskInfo with --json). A monitor also turns
every stdout line into an event (see `sandvisor events`).

COMMAND runs as `sh -c COMMAND` in the policy's image. Several words are joined with shell
quoting (`sandvisor run -- ls -l "a b"`); a single word is the shell command as is
(`sandvisor run -- 'make && make test'`).

Workspace: run in a project directory and the command runs on it, at the same path, as the
directory's owner (the daemon allows directories under its --workspace-root, by default
the home directory of the user running it; elsewhere sandvisor says so and runs without one).
Each project directory has a session of its own (ws-<name>-<hash>), which sandvisor ps, events
and workspace find again from that directory. In overlay mode (the default) the project
on disk stays as it is: review with `sandvisor workspace diff`, then `sandvisor workspace apply`.

examples:
  cd ~/src/app && sandvisor run --policy dev -- python3 -m pytest -q
                                               the project's tests; the project unchanged
  sandvisor workspace diff; sandvisor workspace apply      review what they wrote, then keep it
  sandvisor run --workspace ~/src/app --workspace-mode ro -- make lint
  sandvisor run --no-workspace -- uname -a           no project: a scratch working directory
  sandvisor run -- sh -c 'echo out; exit 3'          prints out, exits 3
  sandvisor run --timeout 30s -- make test           foreground, stopped after 30 s (exit 124)
  echo hello | sandvisor run -- tr a-z A-Z           stdin is forwarded
  sandvisor run --bg --persistent -d "dev server" -- 'npm run dev'
  sandvisor run --monitor -- 'tail -f /var/log/app.log'
  sandvisor run --bg --json --policy untrusted -- ./build.sh | jq -r .task_id
  sandvisor run --bg --env CI=1 --poll-every 5m --stall-after 3s -- ./long-job
"""


def _env_pair(text: str) -> tuple[str, str]:
    """argparse type for ``--env K=V``."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def register(subs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subs.add_parser(
        "run",
        help="run a command in a fresh sandbox (foreground, --bg or --monitor)",
        description="Run a command in its own hardened container: in the foreground (stream\n"
        "its output, exit with its exit code) or in the background.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--bg", action="store_true", help="start in the background; print the id and output path"
    )
    mode.add_argument(
        "--monitor",
        action="store_true",
        help="start a monitor in the background: every stdout line also becomes an event",
    )
    p.add_argument("--policy", default=None, metavar="P", help="policy name (default: default)")
    life = p.add_mutually_exclusive_group()
    life.add_argument(
        "--timeout",
        type=duration_ms,
        default=None,
        metavar="DUR",
        help="stop after this long: 500ms, 30s, 10m, 1h (default: the policy's, 5m)",
    )
    life.add_argument(
        "--persistent", action="store_true", help="no timeout: run until stopped or session end"
    )
    p.add_argument(
        "--poll-every",
        type=duration_s,
        default=None,
        metavar="DUR",
        help="emit a task.poll with the output tail this often (e.g. 5m)",
    )
    p.add_argument(
        "--stall-after",
        type=duration_s,
        default=None,
        metavar="DUR",
        help="report a stall after waiting for stdin this long (e.g. 3s)",
    )
    p.add_argument(
        "--idle-timeout",
        type=duration_ms,
        default=None,
        metavar="DUR",
        help="stop the task when it prints nothing for this long (e.g. 1m)",
    )
    p.add_argument("-d", "--description", default=None, metavar="D", help="label for notices")
    p.add_argument(
        "--env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="K=V",
        help="environment variable for the command (repeatable; the policy's allowlist applies)",
    )
    p.add_argument(
        "--stdin",
        choices=["pipe", "closed"],
        default=None,
        help=(
            "pipe: input can be sent (`sandvisor input`); closed: EOF at once"
            " (default: the policy's)"
        ),
    )
    p.add_argument(
        "--json", action="store_true", help="with --bg/--monitor: print the TaskInfo as JSON"
    )
    add_workspace_options(p)
    add_daemon_options(p)
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND...",
        help="the command; put it after -- so its options stay its own",
    )
    p.set_defaults(func=run, parser=p)


def command_text(words: list[str]) -> str:
    """One word is the shell command as is; several are joined with shell quoting."""
    if words and words[0] == "--":
        words = words[1:]
    if len(words) == 1:
        return words[0]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    args.command_text = command_text(list(args.command))
    if not args.command_text.strip():
        parser.error("a COMMAND is required after --")
    if args.json and not (args.bg or args.monitor):
        parser.error("--json needs --bg or --monitor (the foreground prints the output itself)")
    return call(args, _run, error_code=EXIT_START_FAILED)


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "command": args.command_text,
        "kind": "monitor" if args.monitor else "background",
    }
    optional = {
        "description": args.description,
        "policy": args.policy,
        "timeout_ms": args.timeout,
        "poll_every_s": args.poll_every,
        "stall_after_s": args.stall_after,
        "idle_timeout_ms": args.idle_timeout,
        "stdin": args.stdin,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    if args.persistent:
        spec["persistent"] = True
    if args.env:
        spec["env"] = dict(args.env)
    return spec


async def _run(client: SandvisorClient, args: argparse.Namespace) -> int:
    sid = await open_run_session(client, args, args.policy, EXIT_START_FAILED)
    try:
        info = await client.start(sid, _spec(args))
    except SupervisorError as exc:
        raise CliError(f"the task did not start: {error_message(exc)}", EXIT_START_FAILED) from exc
    if args.bg or args.monitor:
        _print_started(info, args)
        return 0
    return await _foreground(client, sid, info)


def _print_started(info: TaskJson, args: argparse.Namespace) -> None:
    if args.json:
        print_json(info)
    elif want_plain(args):
        sys.stdout.write(f"{info['task_id']}\n{info['output_path']}\n")
    else:
        kind = "monitor" if info.get("kind") == "monitor" else "task"
        sys.stdout.write(
            f"started {kind} {info['task_id']} in session {info['session_id']}\n"
            f"output: {info['output_path']}\n"
            f"follow: sandvisor logs -f {info['task_id']}   "
            f"stop: sandvisor stop {info['task_id']}\n"
        )
    sys.stdout.flush()


# -- foreground ---------------------------------------------------------------------------


def exit_status(info: TaskJson) -> tuple[int, str | None]:
    """The exit status for a final TaskInfo, and a line for stderr when it did not just exit."""
    reason = info.get("reason")
    if reason == "exit":
        exit_code = info.get("exit_code")
        return (int(exit_code) if exit_code is not None else 0), None
    if reason in ("timeout", "idle_timeout"):
        status = EXIT_TIMEOUT
    elif reason is None:
        status = EXIT_START_FAILED
    else:
        status = EXIT_KILLED
    return status, f"task {info['task_id']} {end_clause(info)}"


async def _foreground(client: SandvisorClient, sid: str, info: TaskJson) -> int:
    tid = str(info["task_id"])
    loop = asyncio.get_running_loop()
    signals: list[int] = []
    stream = asyncio.create_task(_stream_output(client, sid, tid))

    def interrupted(signum: int) -> None:
        if not signals:
            signals.append(signum)
            stream.cancel()

    # Ctrl-Z (SIGTSTP) detaches instead of suspending sandvisor: the task runs on in its session.
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGTSTP)
    for sig in handled:
        loop.add_signal_handler(sig, interrupted, sig)
    forward = None
    if info.get("stdin") == "pipe":
        forward = asyncio.create_task(_forward_stdin(client, sid, info))
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await stream
        if signals == [signal.SIGTSTP] and not stream.cancelled():
            signals.clear()  # the output had ended already: nothing left to detach from
        if not signals:
            stream.result()  # re-raise what went wrong while streaming
    except BrokenPipeError:
        # Nobody reads our output any more: a process would die of SIGPIPE; so does the task.
        await _stop_quietly(client, sid, tid)
        raise
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        if forward is not None:
            await _cancel_forwarding(forward, tid)
    if signals == [signal.SIGTSTP]:
        _say_detached(info)
        return 0
    if signals:
        sys.stderr.write(f"sandvisor: stopping task {tid}\n")
        await _stop_quietly(client, sid, tid)
        return 128 + signals[0]
    final = (await client.wait(sid, tid))["task"]
    code, why = exit_status(final)
    if why:
        sys.stderr.write(f"sandvisor: {why}\n")
    return code


def _say_detached(info: TaskJson) -> None:
    """Ctrl-Z: the task runs on; say how to find it again (on stderr: stdout is its output)."""
    tid = info["task_id"]
    stdin = "" if info.get("stdin") != "pipe" else f"   input: sandvisor input {tid} TEXT"
    sys.stderr.write(
        f"\nsandvisor: detached; task {tid} keeps running in session {info['session_id']}\n"
        f"  follow: sandvisor logs -f {tid}   wait: sandvisor wait --timeout 1h {tid}   "
        f"stop: sandvisor stop {tid}{stdin}\n"
    )
    sys.stderr.flush()


async def _stop_quietly(client: SandvisorClient, sid: str, tid: str) -> None:
    """Stop the task on our way out; say so if that fails (the exit status stays ours)."""
    try:
        await client.stop(sid, tid)
    except TaskNotRunning:
        pass  # it ended on its own meanwhile: nothing to stop
    except SupervisorError as exc:
        sys.stderr.write(f"sandvisor: could not stop task {tid}: {error_message(exc)}\n")


async def _cancel_forwarding(forward: asyncio.Task[None], tid: str) -> None:
    """Stop forwarding stdin; a failure it met on the way is said, not raised (the output
    and the exit status are what this command reports)."""
    forward.cancel()
    try:
        await forward
    except asyncio.CancelledError:
        pass  # what we asked for
    except SupervisorError as exc:
        sys.stderr.write(
            f"sandvisor: could not forward stdin to task {tid}: {error_message(exc)}\n"
        )


async def _stream_output(client: SandvisorClient, sid: str, tid: str) -> None:
    """Copy the output to stdout as it arrives, exact bytes, until the task has ended."""
    out = sys.stdout.buffer
    async for piece in client.follow_output(sid, tid):
        out.write(piece.data)
        out.flush()


async def _forward_stdin(client: SandvisorClient, sid: str, info: TaskJson) -> None:
    """Send what arrives on our stdin to the task; EOF when ours ends."""
    tid = str(info["task_id"])
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    def reader() -> None:
        # A daemon thread of its own: a blocking read of a terminal cannot be cancelled, and
        # the event loop's executor would wait for it at exit.
        fd = sys.stdin.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""  # our stdin failed (closed terminal): the task gets EOF, as at its end
            try:
                loop.call_soon_threadsafe(queue.put_nowait, chunk)
            except RuntimeError:  # the loop has closed: sandvisor is exiting
                return
            if not chunk:
                return

    try:
        sys.stdin.fileno()
    except (OSError, ValueError):
        return  # no stdin to forward (closed or replaced): the task just gets none
    threading.Thread(target=reader, name="sandvisor-stdin", daemon=True).start()
    await wait_started(client, sid, info)
    while True:
        chunk = await queue.get()
        try:
            await client.send_input(sid, tid, data=chunk, eof=not chunk)
        except (TaskNotRunning, StdinClosed):
            return  # the task ended or closed its stdin: nothing more to send
        if not chunk:
            return

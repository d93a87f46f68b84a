"""The ``dev`` policy's session network: a server started by one task answers another task
of the same session by task id; another session cannot reach it, and nothing gets out."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import require_engine
from tests.integration.workspaces.support import WsEnv, engine, run, run_ok

pytestmark = [
    pytest.mark.timeout(240),
]

#: curl exit codes that mean "could not connect": unresolved host (6), connection refused or
#: unreachable (7), timed out (28).
NO_CONNECTION = {"6", "7", "28"}


def host_addresses() -> list[str]:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines()} - {"127.0.0.1"})


def curl_codes(output: str) -> dict[str, str]:
    """``target=exit code`` lines printed by the probe below."""
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def probe(targets: list[str]) -> str:
    """curl every target at once (3 s each), print ``target=exit code``."""
    parts = [f"(curl -s -o /dev/null -m 3 {t}; echo {t}=$?) &" for t in targets]
    return " ".join(parts) + " wait"


async def test_session_network_reaches_tasks_of_the_session_only(ws: WsEnv) -> None:
    require_engine()
    project = ws.project({"hello.txt": "hello from the workspace\n"})
    session = await ws.open("net", project, policy="dev")
    server = await session.start(
        {
            "command": "python3 -u -m http.server 8000 --bind 0.0.0.0",
            "policy": "dev",
            "persistent": True,
        }
    )
    await session.wait_for(server.task_id, "Serving HTTP", timeout_s=90)
    out = await run_ok(
        session, f"curl -s -m 10 http://{server.task_id}:8000/hello.txt", policy="dev"
    )
    assert out == "hello from the workspace\n"

    running = await session.get(server.task_id)
    client = engine()
    try:
        nets = client.inspect_container(running.container_id)["NetworkSettings"]["Networks"]
    finally:
        client.close()
    assert list(nets) == [session.network_name("session")]
    address = next(iter(nets.values()))["IPAddress"]
    assert address

    # Another session (same policy, its own network): neither the name nor the address.
    other = await ws.sup.open_session("net-other")
    targets = [f"http://{server.task_id}:8000/", f"http://{address}:8000/"]
    _, out = await run(other, probe(targets), policy="dev")
    codes = curl_codes(out)
    assert set(codes) == set(targets) and set(codes.values()) <= NO_CONNECTION, out
    await other.end()

    # No egress from the session: not the internet, not the host.
    outside = ["http://1.1.1.1/", *(f"http://{a}:2375/" for a in host_addresses())]
    _, out = await run(session, probe(outside), policy="dev")
    codes = curl_codes(out)
    assert set(codes) == set(outside) and set(codes.values()) <= NO_CONNECTION, out

    await session.end()
    client = engine()
    try:
        left = client.networks(names=[session.network_name("session")])
    finally:
        client.close()
    assert left == []

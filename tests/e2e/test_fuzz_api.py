"""Schemathesis against the live daemon's own OpenAPI document: whatever it is sent, the API
never answers 5xx. Cases are steered toward a real session and real task ids (so the deep
paths run, not only 404s), task starts go to the ``fast`` policy, and server-side waits are
capped so the run stays bounded."""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from tests.e2e.conftest import Daemon

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

#: Examples per operation and generation mode (positive: schema-valid, negative: invalid).
EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 10}
#: Longest server-side wait a fuzzed request may ask for (the API allows 300 s).
MAX_WAIT = 1.0
SID = "fuzz"


def _clamp(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_WAIT:
        return MAX_WAIT
    return value


def test_fuzz_api_never_answers_5xx(daemon: Daemon) -> None:
    assert daemon.tcp is not None
    base_url = f"http://{daemon.tcp}"
    admin = daemon.client()
    tok = admin.post("/sessions", json={"session_id": SID}).json()["token"]
    tasks = f"/sessions/{SID}/tasks"
    done = admin.post(
        tasks, json={"command": "echo fuzz; printf 'caf\\303\\251 \\377\\n'", "policy": "fast"}
    ).json()["task_id"]
    assert admin.post(f"{tasks}/{done}/wait", json={"timeout_s": 60}).json()["timed_out"] is False

    def start_sleeper() -> str:
        r = admin.post(tasks, json={"command": "echo up; exec sleep 600", "policy": "fast"})
        assert r.status_code == 201, r.text
        tid: str = r.json()["task_id"]
        return tid

    running = [start_sleeper()]

    def live_task() -> str:
        """A running task (the fuzzer stops it now and then: start another)."""
        if admin.get(f"{tasks}/{running[0]}").json()["status"] not in ("starting", "running"):
            running[0] = start_sleeper()
        return running[0]

    loaded = schemathesis.openapi.from_url(f"{base_url}/openapi.json", timeout=30)
    # The stream never ends while the session is open; test_sse covers it.
    schema = loaded.exclude(path_regex=r"/events/stream$")
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert len(operations) >= 15

    http = requests.Session()
    throwaway = itertools.count()
    statuses: dict[str, Counter[int]] = defaultdict(Counter)
    failures: list[str] = []

    def steer(case: schemathesis.Case[Any], data: st.DataObject) -> None:
        ends_session = case.path in ("/sessions/{session_id}", "/sessions/{session_id}/end") and (
            case.method.upper() in ("DELETE", "POST")
        )
        params = case.path_parameters or {}
        real = data.draw(st.sampled_from([True, True, True, False]), label="real session")
        if "session_id" in params and real:
            if ends_session:
                # Ending routes get a session of their own, so the main one survives.
                fresh = f"fz-end-{next(throwaway)}"
                assert admin.post("/sessions", json={"session_id": fresh}).status_code == 201
                params["session_id"] = fresh
            else:
                params["session_id"] = SID
        if "task_id" in params:
            pick = data.draw(st.sampled_from(["done", "running", "generated"]), label="task")
            if pick != "generated":
                params["task_id"] = done if pick == "done" else live_task()
        who = data.draw(st.sampled_from(["admin"] * 4 + ["session"] * 3 + ["as generated"]))
        if who != "as generated":
            for name in [h for h in case.headers if h.lower() == "authorization"]:
                del case.headers[name]
            case.headers["Authorization"] = f"Bearer {daemon.token if who == 'admin' else tok}"
        if case.query:
            for key in ("wait_s",):
                if key in case.query:
                    case.query[key] = _clamp(case.query[key])
        if isinstance(case.body, dict):
            if case.path.endswith(("/wait", "/wait-for")):
                # Left out, timeout_s defaults to 30 s: on the live task, every case would wait.
                case.body["timeout_s"] = _clamp(case.body.get("timeout_s", MAX_WAIT))
            if case.path == "/sessions/{session_id}/tasks":
                case.body["policy"] = "fast"  # small image, 1 s grace: cheap to start and stop

    def run(case: schemathesis.Case[Any], data: st.DataObject) -> None:
        label = f"{case.method.upper()} {case.path}"
        steer(case, data)
        try:
            response = case.call(base_url=base_url, session=http, timeout=60)
        except requests.exceptions.InvalidHeader:
            return  # requests refused to send it; nothing reached the daemon
        statuses[label][response.status_code] += 1
        if response.status_code >= 500:
            failures.append(
                f"{response.status_code} {label}\n  {case.as_curl_command()}\n"
                f"  -> {response.text[:500]}"
            )

    for op in operations:
        for mode, examples in EXAMPLES.items():
            if mode is GenerationMode.NEGATIVE and not (list(op.query) or list(op.body)):
                continue  # only path strings and a header: nothing can be made invalid
            fuzz = settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )(given(case=op.as_strategy(generation_mode=mode), data=st.data())(run))
            try:
                fuzz()
            except Unsatisfiable:
                # Nothing in this operation can be made invalid (e.g. GET /healthz).
                assert mode is GenerationMode.NEGATIVE, op.label

    summary = "\n".join(f"{label}: {dict(sorted(c.items()))}" for label, c in statuses.items())
    print(summary)
    assert not failures, "server errors:\n" + "\n".join(failures[:20])

    # The steering worked: most operations reached a success, not only 401/404/422.
    succeeded = [label for label, c in statuses.items() if any(200 <= s < 300 for s in c)]
    assert len(statuses) == len(operations)
    assert len(succeeded) >= len(operations) * 2 // 3, summary

    # Clean up everything the fuzzer opened or started; nothing may be left running.
    for session in admin.get("/sessions").json():
        assert admin.delete(f"/sessions/{session['session_id']}").status_code == 200
    health = admin.get("/healthz").json()
    assert (health["sessions"], health["running_tasks"]) == (0, 0)
    admin.close()
    http.close()
    log = daemon.log.read_text(errors="replace")
    assert not re.search(r"Traceback|Exception in ASGI application", log), log[-5000:]
    with httpx.Client(base_url=base_url) as anon:
        assert anon.get("/healthz").status_code == 200

"""Schemathesis against the daemon's own OpenAPI document, with every check on: no 5xx,
every status, content type, header and body as documented, schema-invalid data refused,
auth enforced, 405 with a true Allow header, ended sessions gone. Cases are steered toward a
real session and real task ids (so the deep paths run, not only 404s), task starts go to
the ``fast`` policy, and server-side waits are capped so the run stays bounded.

The daemon is in-process on the fake engine (tests/component/daemon_app.py), its loopback
TCP listener's app on a real port (schemathesis' auth probes open connections of their own):
what the fuzzer checks is the API's contract, which needs no container (moved from
tests/e2e, where a real daemon and engine made it take 80 s)."""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.core.result import Ok

from supervisor.engine.fake import Out, Script
from tests.component.daemon_app import ListeningDaemon, listening_daemon
from tests.e2e.projects import make_project

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

#: What the one finished task printed (ASCII, a multibyte character, an invalid byte).
DONE_COMMAND = "echo fuzz; printf 'caf\\303\\251 \\377\\n'"
DONE_OUTPUT = b"fuzz\ncaf\xc3\xa9 \xff\n"

#: Examples per operation and generation mode (positive: schema-valid, negative: invalid).
EXAMPLES = {GenerationMode.POSITIVE: 25, GenerationMode.NEGATIVE: 10}
#: Longest server-side wait a fuzzed request may ask for (the API allows 300 s).
MAX_WAIT = 1.0
SID = "fuzz"
#: Every check is on, with one exception said in the API's own terms: a task spec is checked
#: against the policy it names (allowed environment names, limits, persistence) and its
#: duration strings against the ranges of the fields they stand for. The schema cannot state
#: either, so a schema-valid spec may be refused with 400 (policy) or 422 (range), and
#: "schema-valid request rejected" (ST202) is expected there for those two statuses only.
SEMANTIC_REFUSALS = {
    ("POST /sessions/{session_id}/tasks", 400),
    ("POST /sessions/{session_id}/tasks", 422),
    # Likewise a session's workspace: whether a path exists, is a directory under the
    # daemon's workspace roots, or is the one an open session already has, no schema says.
    ("POST /sessions", 400),
}


def _clamp(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_WAIT:
        return MAX_WAIT
    return value


def _keep_state_valid(
    path: str, params: dict[str, Any], body: dict[str, Any], admin: httpx.Client, project: Path
) -> None:
    """Like the real ids, keep schema-valid bodies valid for the state the daemon is in
    (which no schema can say): an ack names a seq the session has reached, a wait-for
    pattern is a regular expression Python compiles, a workspace is a project under the
    daemon's roots, with a policy that exists."""
    if path == "/sessions":
        if isinstance(body.get("workspace"), dict):
            body["workspace"] = {**body["workspace"], "path": str(project)}
        if "policy" in body:
            body["policy"] = "fast"
    if path.endswith("/notifications/ack") and isinstance(body.get("seq"), (int, float)):
        sid = params.get("session_id", SID)
        last = admin.get(f"/sessions/{sid}").json().get("last_seq", 0)
        body["seq"] = min(body["seq"], last)
    if path.endswith("/wait-for") and isinstance(body.get("pattern"), str):
        try:
            re.compile(body["pattern"])
        except re.error:
            body["pattern"] = re.escape(body["pattern"])


def test_fuzz_api_conforms_to_its_openapi(
    tmp_path: Path, policies_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "projects"
    root.mkdir()
    with listening_daemon(tmp_path / "state", policies_dir, workspace_roots=[root]) as daemon:
        daemon.daemon.engine.script(DONE_COMMAND, Script(Out(DONE_OUTPUT)))
        _fuzz(daemon, root, caplog)


def _fuzz(daemon: ListeningDaemon, root: Path, caplog: pytest.LogCaptureFixture) -> None:
    base_url = f"http://{daemon.tcp}"
    admin = daemon.client()
    # The session has a workspace, so that its workspace routes answer (and the tasks the
    # fuzzer starts run on it).
    project = make_project(root / "fuzz", {"README": "fuzz\n"})
    opened = admin.post(
        "/sessions", json={"session_id": SID, "workspace": {"path": str(project)}}
    ).json()
    tok = opened["token"]
    tasks = f"/sessions/{SID}/tasks"
    done = admin.post(tasks, json={"command": DONE_COMMAND, "policy": "fast"}).json()["task_id"]
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

    loaded = schemathesis.openapi.from_dict(
        admin.get("/openapi.json").json(),
    )
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
    kinds: Counter[tuple[str, str, str]] = Counter()

    def steer(case: schemathesis.Case[Any], data: st.DataObject) -> dict[str, str] | None:
        """Point the case at real ids; returns the auth header to send (None: the case's own
        generated headers decide). Parts are replaced, never edited in place: schemathesis
        re-checks a replaced part, so a negative case the steering made valid is judged as
        the valid request it became."""
        ends_session = case.path in ("/sessions/{session_id}", "/sessions/{session_id}/end") and (
            case.method.upper() in ("DELETE", "POST")
        )
        # The body was made schema-valid, also in a negative case whose invalid part is
        # elsewhere: a path id, which the steering may replace with a real one, making the
        # whole case valid (a negative case's ack then kept its seq past the session's last
        # event: a 422 judged "schema-valid request rejected").
        valid_body = case.meta is None or not case.meta.is_negative_at(ParameterLocation.BODY)
        params = dict(case.path_parameters or {})
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
        if params != case.path_parameters:
            case.path_parameters = params
        who = data.draw(st.sampled_from(["admin"] * 4 + ["session"] * 3 + ["as generated"]))
        if case.meta is not None and case.meta.is_negative_at(ParameterLocation.HEADER):
            who = "as generated"  # the invalid part may be the Authorization header itself
        auth = None
        if who != "as generated":
            auth = {"Authorization": f"Bearer {daemon.token if who == 'admin' else tok}"}
            # In the case too (its own generated value replaced), so the case still has the
            # header its security scheme requires; passed explicitly as well, so the auth
            # checks know the token is a real one.
            others = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
            case.headers = {**others, **auth}
        for name in ("wait_s", "wait_output_s"):
            if case.query and name in case.query:
                case.query = {**case.query, name: _clamp(case.query[name])}
        if isinstance(case.body, dict):
            body = dict(case.body)
            if case.path.endswith(("/wait", "/wait-for")):
                # Left out, timeout_s defaults to 30 s: on the live task, every case would wait.
                body["timeout_s"] = _clamp(body.get("timeout_s", MAX_WAIT))
            if case.path == "/sessions/{session_id}/tasks":
                body["policy"] = "fast"  # small image, 1 s grace: cheap to start and stop
            if valid_body:
                _keep_state_valid(case.path, case.path_parameters or {}, body, admin, project)
            if body != case.body:
                case.body = body
        return auth

    def run(case: schemathesis.Case[Any], data: st.DataObject) -> None:
        label = f"{case.method.upper()} {case.path}"
        auth = steer(case, data)
        try:
            response = case.call(base_url=base_url, session=http, headers=auth, timeout=60)
        except requests.exceptions.InvalidHeader:
            return  # requests refused to send it; nothing reached the daemon
        statuses[label][response.status_code] += 1
        try:
            case.validate_response(
                response,
                headers=auth,
                transport_kwargs={"base_url": base_url, "session": http, "headers": auth or {}},
            )
        except FailureGroup as exc:
            found = [
                f
                for f in exc.exceptions
                if not (f.code == "ST202" and (label, response.status_code) in SEMANTIC_REFUSALS)
            ]
            for failure in found:
                kinds[(label, failure.code, failure.title)] += 1
            if found:
                failures.append(f"{label}: {exc}"[:3000])

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
    print("\n".join(failures))
    distinct = "\n".join(
        f"  {n}x {label}: {code} {title}" for (label, code, title), n in kinds.items()
    )
    assert not failures, f"{len(failures)} failed checks:\n{distinct}\n" + "\n".join(failures[:5])

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
    # What the e2e test read in the daemon's log: a traceback (the app's, as uvicorn logs
    # it, or the daemon's own).
    logged = [
        r
        for r in caplog.records
        if r.exc_info or re.search(r"Traceback|Exception in ASGI application", r.getMessage())
    ]
    assert not logged, [r.getMessage() for r in logged]
    with httpx.Client(base_url=base_url) as anon:
        assert anon.get("/healthz").status_code == 200

"""Screenshots for the README: the dashboard with ten tasks in mixed states, and a task's
page with a coloured live transcript (docs/dashboard.png, docs/dashboard-task.png)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Ui, docs_dir

pytestmark = pytest.mark.timeout(240)

#: A test runner's output with colours, a line at a time, then it keeps running.
TESTS = (
    "i=1; for t in api auth cache db events http io jobs mail queue; do "
    "printf '\\033[1mtest_%s\\033[0m ... \\033[32mok\\033[0m (%d ms)\\n' $t $((i*37)); "
    "i=$((i+1)); sleep 0.2; done; "
    "printf '\\033[33mwarning:\\033[0m test_retry is flaky (2 of 3)\\n'; "
    "printf '\\033[31mFAIL\\033[0m test_upload: expected 201, got 500\\n'; "
    "printf 'waiting for changes (\\033[36mwatch mode\\033[0m)\\n'; sleep 600"
)


def test_screenshots_for_the_readme(ui: Ui, page: Page) -> None:
    ui.session("agent-7f3a")
    ui.session("ci-1042")
    a, c = "agent-7f3a", "ci-1042"
    done = ui.start(a, "echo built 42 modules in 1.9s", description="build", policy="fast")
    fail = ui.start(c, "echo 'FAIL test_login'; exit 1", description="unit tests", policy="fast")
    stop = ui.start(a, "sleep 600", description="old dev server", policy="fast")
    late = ui.start(c, "sleep 60", description="e2e suite", timeout_ms=1000, policy="fast")
    idle = ui.start(a, "sleep 60", description="log tail", idle_timeout_ms=1000, policy="fast")
    serve = ui.start(
        a,
        "echo 'listening on :3000'; while sleep 2; do echo 'GET / 200 3ms'; done",
        description="dev server",
        persistent=True,
        policy="fast",
    )
    ask = ui.start(
        c,
        "printf 'Overwrite the snapshot? [y/N] '; read -r x",
        description="update snapshots",
        stall_after_s=1,
        policy="fast",
    )
    watch = ui.start(
        c,
        'while sleep 1; do echo "$(date +%T) queue depth 3"; done',
        description="queue monitor",
        kind="monitor",
        policy="fast",
    )
    runner = ui.start(a, TESTS, description="test watcher", poll_every_s=2, policy="fast")
    ui.start(c, "ls /", description="list root", policy="fast")
    ui.wait_task(a, stop["task_id"], lambda t: t["status"] == "running")
    with ui.api() as client:
        client.post(f"/sessions/{a}/tasks/{stop['task_id']}/stop")
    for sid, task, status in (
        (a, done, "completed"),
        (c, fail, "failed"),
        (a, stop, "killed"),
        (c, late, "killed"),
        (a, idle, "killed"),
    ):
        ui.wait_task(sid, task["task_id"], lambda t, s=status: t["status"] == s)  # type: ignore[misc]
    ui.wait_task(c, ask["task_id"], lambda t: t["stalled"])
    ui.wait_task(a, runner["task_id"], lambda t: t["output_bytes"] > 500)
    ui.wait_task(c, watch["task_id"], lambda t: t["output_bytes"] > 0)
    ui.wait_task(a, serve["task_id"], lambda t: t["status"] == "running")

    ui.login(page)
    page.set_viewport_size({"width": 1440, "height": 640})
    expect(page.locator("#tasks-table tbody tr")).to_have_count(10)
    expect(page.locator("#tasks-table .badge.stalled")).to_have_count(1)
    expect(page.locator("#tasks-table .badge.monitor")).to_have_count(1)
    expect(page.locator("#tasks-table .badge.persistent")).to_have_count(1)
    expect(page.locator("#tasks-table")).to_contain_text("killed, user stopped")
    expect(page.locator("#tasks-table")).to_contain_text("killed, timeout")
    page.screenshot(path=str(docs_dir() / "dashboard.png"))

    page.goto(f"{ui.base}/ui/sessions/{a}/tasks/{runner['task_id']}")
    page.set_viewport_size({"width": 1440, "height": 760})
    expect(page.locator("#transcript .line").last).to_contain_text("watch mode")
    expect(page.locator("#transcript .fg2").first).to_have_text("ok")  # green, from SGR 32
    poll = page.locator("#events li[data-type='task.poll']").first
    expect(poll).to_be_visible()
    # The panel shows what the agent was handed: rendered text, no escape sequences.
    expect(poll).to_contain_text("test_api ... ok (37 ms)")
    expect(poll.locator("pre.xml")).not_to_contain_text("\\x1b[")
    page.screenshot(path=str(docs_dir() / "dashboard-task.png"))
    with ui.api() as client:
        for sid in (a, c):
            client.post(f"/sessions/{sid}/end")

"""What the pages make of awkward output and of workspaces: ANSI colours become styled text,
other escapes vanish, control and bidi characters are shown as visible marks, a carriage
return keeps what overwrote the line; a session's pending workspace changes are counted."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Ui
from tests.e2e.projects import make_project

pytestmark = pytest.mark.timeout(120)

OUTPUT = (
    "printf '\\033[31mred\\033[0m plain \\033[1;38;5;208mbold orange\\033[0m\\n'; "
    "printf '\\033]0;window title\\007titled\\n'; "
    "printf 'back\\010space bell\\007 rlo \\342\\200\\256gnp.exe\\n'; "
    "printf '10%%\\r50%%\\r100%% done\\n'"
)


def test_ansi_and_control_characters(ui: Ui, page: Page) -> None:
    ui.session("render")
    task = ui.start("render", OUTPUT, policy="fast")
    ui.wait_task("render", task["task_id"], lambda t: t["status"] == "completed")
    ui.login(page)
    page.goto(f"{ui.base}/ui/sessions/render/tasks/{task['task_id']}")
    expect(page.locator("#transcript[data-eof=true]")).to_be_attached()
    lines = page.locator("#transcript .line")
    expect(lines).to_have_text(
        [
            "red plain bold orange",
            "titled",
            "back\\x08space bell\\x07 rlo \\u202egnp.exe",
            "100% done",
        ]
    )
    expect(lines.nth(0).locator(".fg1")).to_have_text("red")
    orange = lines.nth(0).locator("span.b")
    expect(orange).to_have_text("bold orange")
    assert orange.evaluate("e => getComputedStyle(e).color") == "rgb(255, 135, 0)"
    expect(lines.nth(2).locator(".ctl")).to_have_text(["\\x08", "\\x07", "\\u202e"])


def test_workspace_pending_changes_in_the_sessions_table(ui: Ui, page: Page) -> None:
    project = make_project(ui.projects / "app", {"README": "hello\n"})
    ui.session("ws", workspace={"path": str(project), "mode": "overlay"})
    task = ui.start("ws", "echo new > notes.txt && echo changed >> README", policy="fast")
    info = ui.wait_task("ws", task["task_id"], lambda t: t["status"] in ("completed", "failed"))
    assert info["exit_code"] == 0, info
    ui.login(page)
    cell = page.locator('#sessions-table tr[data-session-id="ws"] td[data-col="changes"]')
    expect(cell).to_have_text("2")
    expect(page.locator('#sessions-table tr[data-session-id="ws"]')).to_contain_text(
        f"{project} (overlay)"
    )
    page.goto(f"{ui.base}/ui/sessions/ws")
    expect(page.locator("#workspace")).to_contain_text("2 pending changes")
    with ui.api() as c:
        c.post("/sessions/ws/end")


def test_bidi_and_invisible_characters_in_names_are_shown(ui: Ui, page: Page) -> None:
    """Issue 22, item 12: a description with a right-to-left override (and other invisible
    format characters) showed reordered in the table, the task's title and the session's
    timeline; now each page shows the escapes the agent's notifications have."""
    ui.session("bidi")
    name = "invoice_\u202etxt.exe zw\u200bsp tag\U000e0041"
    shown = "invoice_\\u202etxt.exe zw\\u200bsp tag\\U000e0041"
    task = ui.start("bidi", "printf 'out \\342\\200\\256x\\n'", description=name, policy="fast")
    tid = task["task_id"]
    ui.wait_task("bidi", tid, lambda t: t["status"] == "completed")
    ui.login(page)
    cell = page.locator(f'#tasks-table tr[data-task-id="{tid}"] td[data-col="description"]')
    expect(cell).to_have_text(shown)
    page.goto(f"{ui.base}/ui/sessions/bidi")
    summary = page.locator("#timeline li .summary").last
    expect(summary).to_have_text(f'Background command "{shown}" completed (exit code 0)')
    expect(page.locator("#timeline li pre.xml").last).to_contain_text(shown)
    page.goto(f"{ui.base}/ui/sessions/bidi/tasks/{tid}")
    expect(page.locator("#title")).to_have_text(shown)
    expect(page.locator("#transcript .line")).to_have_text(["out \\u202ex"])
    for where in ("#tasks-table", "#title", "#timeline", "#transcript"):
        for text in page.locator(where).all_inner_texts():
            assert not any(ch in text for ch in "\u202e\u200b\U000e0041"), (where, text)

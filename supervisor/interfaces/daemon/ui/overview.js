// The dashboard's first page: every session this login may see, with its tasks counted by
// state and its workspace, and every task in one live table. One merged event stream
// (lifecycle events only) keeps it current; sizes of running tasks are refreshed every 2 s
// while the tab is visible.

import { LIFECYCLE, LiveStream, api, el, header, isFinal, notice, sessionPage, throttle } from "./common.js";
import { visibleText } from "./ansi.js";
import { TaskTable } from "./tasks-table.js";

header([["Dashboard", null]]);

const sessionsBody = document.querySelector("#sessions-table tbody");
let sessions = [];
const changes = new Map(); // session id -> pending changes (a number, or a text)

const table = new TaskTable(document.getElementById("tasks-table"), {
  showSession: true,
  filterInput: document.getElementById("filter"),
  stateSelect: document.getElementById("state"),
  countLabel: document.getElementById("task-count"),
  onchange: () => renderSessions(),
});

function counts(sid) {
  const c = { total: 0, running: 0, waiting: 0, completed: 0, failed: 0, killed: 0 };
  for (const t of table.tasks.values()) {
    if (t.session_id !== sid) continue;
    c.total += 1;
    if (!isFinal(t)) c.running += 1;
    if (t.stalled && !isFinal(t)) c.waiting += 1;
    if (isFinal(t)) c[t.status] += 1;
  }
  return c;
}

function workspaceCell(s) {
  if (!s.workspace) return el("td", { class: "muted" }, "-");
  const path = visibleText(s.workspace.path);
  return el("td", { class: "mono", title: path }, `${path} (${s.workspace.mode})`);
}

function renderSessions() {
  const rows = sessions.map((s) => {
    const c = counts(s.session_id);
    const pending = changes.get(s.session_id);
    return el(
      "tr",
      { dataset: { sessionId: s.session_id } },
      el("td", {}, el("a", { href: sessionPage(s.session_id) }, s.session_id)),
      el("td", { class: "num" }, c.total),
      el("td", { class: "num" }, c.running),
      el("td", { class: c.waiting ? "num warn" : "num" }, c.waiting),
      el("td", { class: "num" }, c.completed),
      el("td", { class: c.failed ? "num bad" : "num" }, c.failed),
      el("td", { class: "num" }, c.killed),
      workspaceCell(s),
      el("td", { class: "num", dataset: { col: "changes" } }, pending === undefined ? "-" : pending),
    );
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No open sessions.")));
  sessionsBody.replaceChildren(...rows);
  document.getElementById("session-count").textContent = `${sessions.length} open`;
}

async function refreshChanges(sid) {
  const s = sessions.find((x) => x.session_id === sid);
  if (!s || !s.workspace) return;
  if (s.workspace.mode !== "overlay") {
    changes.set(sid, s.workspace.mode === "rw" ? "written through" : "read-only");
  } else {
    try {
      // One change is enough: the page's total counts them all (without hashing them).
      const page = await api(`/sessions/${encodeURIComponent(sid)}/workspace/changes?limit=1`);
      changes.set(sid, page.total);
    } catch {
      changes.set(sid, "?");
    }
  }
  renderSessions();
}

async function refreshAll() {
  try {
    const [ss, ts] = await Promise.all([api("/sessions"), api("/tasks")]);
    sessions = ss;
    table.setAll(ts);
    renderSessions();
    for (const s of sessions) refreshChanges(s.session_id);
  } catch (err) {
    notice(`Could not read the sessions: ${err.message}`);
  }
}

// Tasks named by events, read again in one go (a burst of events costs a few requests).
const dirty = new Map(); // task id -> session id
const readDirty = throttle(async () => {
  const batch = [...dirty];
  dirty.clear();
  if (batch.length > 20) {
    await refreshAll();
    return;
  }
  await Promise.all(
    batch.map(async ([tid, sid]) => {
      try {
        table.upsert(await api(`/sessions/${encodeURIComponent(sid)}/tasks/${encodeURIComponent(tid)}`));
      } catch {
        // its session ended meanwhile: the session.ended event removes it
      }
    }),
  );
}, 100);

const changesLater = new Map();
function onEvent(ev, _seq, type) {
  if (type === "task.created") {
    // A task just started through the API (its task.started comes once its container runs).
    table.upsert(ev);
    if (!sessions.some((s) => s.session_id === ev.session_id)) refreshAll();
    return;
  }
  if (ev.type === "session.ended") {
    sessions = sessions.filter((s) => s.session_id !== ev.session_id);
    table.removeSession(ev.session_id);
    renderSessions();
    return;
  }
  if (!sessions.some((s) => s.session_id === ev.session_id)) {
    refreshAll(); // a session opened since the last look
    return;
  }
  if (!ev.task_id) return;
  dirty.set(ev.task_id, ev.session_id);
  readDirty();
  if (ev.type === "task.stopped" && !changesLater.has(ev.session_id)) {
    changesLater.set(ev.session_id, setTimeout(() => {
      changesLater.delete(ev.session_id);
      refreshChanges(ev.session_id);
    }, 2000));
  }
}

new LiveStream(() => `/events/stream?${LIFECYCLE.map((t) => `types=${t}`).join("&")}`, {
  types: [...LIFECYCLE, "task.created"],
  onevent: onEvent,
  onopen: refreshAll,
}).start();

setInterval(() => table.tick(), 1000);
setInterval(async () => {
  if (document.hidden || !table.hasActive()) return;
  try {
    for (const t of await api("/tasks?active=true")) table.upsert(t);
  } catch {
    // shown by the next event or refresh
  }
}, 2000);

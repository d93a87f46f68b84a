// One session's page: its tasks (live table), its workspace and the notifications timeline,
// kept current by the session's event stream (resumed from the last event seen).

import { LIFECYCLE, EVENT_TYPES, LiveStream, SESSION_ID, api, el, header, isFinal, notice, throttle } from "./common.js";
import { visibleText } from "./ansi.js";
import { TaskTable } from "./tasks-table.js";
import { Timeline } from "./timeline.js";

const sid = decodeURIComponent(location.pathname.split("/")[3] || "");
if (!SESSION_ID.test(sid)) throw new Error("not a session id");
const base = `/sessions/${encodeURIComponent(sid)}`;
header([["Dashboard", "/ui/"], [`session ${sid}`, null]]);
document.title = `${sid} · sandvisor`;

const table = new TaskTable(document.getElementById("tasks-table"), {
  filterInput: document.getElementById("filter"),
  stateSelect: document.getElementById("state"),
  countLabel: document.getElementById("task-count"),
  onchange: (tasks) => renderCounts(tasks),
});
const timelineBox = document.getElementById("timeline");
const timeline = new Timeline(timelineBox, sid);
document.getElementById("hide-noise").addEventListener("change", (e) => {
  timelineBox.classList.toggle("hide-noise", e.target.checked);
});

let info = null;
let cursor = 0;

function renderCounts(tasks) {
  const c = { running: 0, waiting: 0, completed: 0, failed: 0, killed: 0 };
  for (const t of tasks.values()) {
    if (!isFinal(t)) c.running += 1;
    if (t.stalled && !isFinal(t)) c.waiting += 1;
    if (isFinal(t)) c[t.status] += 1;
  }
  const box = document.getElementById("counts");
  box.replaceChildren(
    ...Object.entries({ tasks: tasks.size, running: c.running, "waiting for input": c.waiting, completed: c.completed, failed: c.failed, killed: c.killed })
      .map(([label, n]) => el("div", { class: "count", dataset: { count: label } }, el("b", {}, n), label)),
  );
}

const refreshChanges = throttle(async () => {
  const box = document.getElementById("workspace");
  if (!info || !info.workspace) {
    box.textContent = "No workspace: tasks run in the policy's scratch directory.";
    return;
  }
  const ws = info.workspace;
  let pending = "";
  if (ws.mode === "overlay") {
    try {
      const { total } = await api(`${base}/workspace/changes?limit=1`);
      pending = `${total} pending change${total === 1 ? "" : "s"} (sandvisor workspace diff / apply)`;
    } catch (err) {
      pending = `changes unknown (${err.message})`;
    }
  } else {
    pending = ws.mode === "rw" ? "writes go straight to the project" : "read-only";
  }
  box.replaceChildren(el("span", { class: "mono" }, visibleText(ws.path)), ` · ${ws.mode} · `, el("span", { dataset: { col: "changes" } }, pending));
}, 2000);

async function refreshTasks() {
  table.setAll(await api(`${base}/tasks`));
}

const dirty = new Set();
const readDirty = throttle(async () => {
  const batch = [...dirty];
  dirty.clear();
  if (batch.length > 20) return refreshTasks();
  await Promise.all(batch.map(async (tid) => {
    try {
      table.upsert(await api(`${base}/tasks/${encodeURIComponent(tid)}`));
    } catch {
      // the session ended
    }
  }));
}, 100);

function onEvent(ev, seq) {
  if (seq) cursor = Math.max(cursor, seq);
  if (ev.type === "session.ended") {
    notice("This session has ended: its tasks were stopped and removed.", "info");
    stream.close();
  }
  if (LIFECYCLE.includes(ev.type) && ev.task_id) {
    dirty.add(ev.task_id);
    readDirty();
    if (ev.type === "task.stopped") refreshChanges();
  }
  if (ev.type !== "task.started") timeline.update();
}

let stream = null;
async function main() {
  try {
    info = await api(base);
  } catch (err) {
    notice(`Could not read the session: ${err.message}`);
    return;
  }
  cursor = info.last_seq;
  await refreshTasks();
  refreshChanges();
  // The most recent part of a long session's timeline, not all of it.
  await timeline.start(Math.max(0, cursor - 5000));
  stream = new LiveStream(() => `${base}/events/stream?after=${cursor}`, {
    types: EVENT_TYPES,
    onevent: onEvent,
    onopen: () => refreshTasks().catch(() => {}),
  }).start();
}

main();
setInterval(() => table.tick(), 1000);
setInterval(async () => {
  if (document.hidden || !table.hasActive()) return;
  try {
    for (const t of await api(`${base}/tasks?active=true`)) table.upsert(t);
  } catch {
    // the session ended
  }
}, 2000);

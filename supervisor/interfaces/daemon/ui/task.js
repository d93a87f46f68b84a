// A task's page: its live transcript (the command first, then its output line by line),
// what the agent was told about it, and its controls (stop, a line of input, download).
// Output is read by offset (long-polling for more); the session's event stream, filtered
// to this task, says when its state or notifications changed.

import {
  LIFECYCLE,
  EVENT_TYPES,
  LiveStream,
  SESSION_ID,
  TASK_ID,
  api,
  badges,
  describeEnd,
  el,
  formatBytes,
  formatElapsed,
  formatTime,
  header,
  isFinal,
  notice,
  post,
  runningMs,
  sessionPage,
  statusClass,
  taskPath,
  throttle,
  visible,
  withToken,
} from "./common.js";
import { safeText, visibleText } from "./ansi.js";
import { Timeline } from "./timeline.js";
import { Transcript } from "./transcript.js";

const parts = location.pathname.split("/");
const sid = decodeURIComponent(parts[3] || "");
const tid = decodeURIComponent(parts[5] || "");
if (!SESSION_ID.test(sid) || !TASK_ID.test(tid)) throw new Error("not a task page");
header([["Dashboard", "/ui/"], [`session ${sid}`, sessionPage(sid)], [tid, null]]);

/** How much of a long output the page starts with (the rest: download). */
const TAIL_START = 256 * 1024;
/** Bytes per read. */
const CHUNK = 256 * 1024;
/** Further behind than this, the page skips ahead rather than replay everything. */
const FAR_BEHIND = 8 * 1024 * 1024;

const box = document.getElementById("transcript");
const transcript = new Transcript(box, { jump: document.getElementById("jump") });
transcript.droppedNote = document.getElementById("dropped");
const events = new Timeline(document.getElementById("events"), sid, { taskId: tid, showTask: false, page: 10000 });
const stopButton = document.getElementById("stop");
const form = document.getElementById("input-form");
const input = document.getElementById("input-line");
const inputState = document.getElementById("input-state");
let task = null;
let offset = 0;

function field(name, value, attrs = {}) {
  return [el("dt", {}, name), el("dd", { dataset: { field: name }, ...attrs }, value)];
}

function render() {
  document.title = `${tid} · sandvisor`;
  document.getElementById("title").textContent = visibleText(task.description || task.command);
  const status = document.getElementById("status");
  status.className = `status ${statusClass(task)}`;
  status.replaceChildren(el("span", { class: "status-text" }, describeEnd(task)), ...badges(task));
  document.getElementById("facts").replaceChildren(
    ...field("kind", task.kind),
    ...field("policy", task.policy),
    ...field("runtime", task.runtime === "runsc" ? "runsc (gVisor)" : task.runtime || "-"),
    ...field("exit code", task.exit_code ?? "-"),
    ...field("started", formatTime(task.started_at)),
    ...field("running", task.started_at ? formatElapsed(runningMs(task)) : "-", { id: "running" }),
    ...field("output", formatBytes(Math.max(task.output_bytes, offset)), { id: "size" }),
    ...field("timeout", task.persistent ? "none (persistent)" : formatElapsed(task.timeout_ms)),
    ...field("stdin", task.stdin),
    ...(task.error ? field("error", task.error) : []),
  );
  const ended = isFinal(task);
  stopButton.disabled = ended;
  const open = !ended && task.stdin === "pipe";
  input.disabled = !open;
  form.querySelector("button").disabled = !open;
  if (!open) inputState.textContent = ended ? "The task has ended." : "This task's stdin is closed.";
  const prompt = document.getElementById("prompt");
  prompt.hidden = !(task.stalled && !ended);
  // The held partial line is not in the transcript until its newline; a prompt usually is
  // one, so it is quoted here, where the answer goes.
  const held = transcript.pending.trim();
  document.getElementById("prompt-text").textContent = held ? safeText(held.slice(-200)) : "";
}

async function refresh() {
  try {
    task = await api(taskPath(sid, tid));
    render();
  } catch (err) {
    if (err.status === 404) notice("This task is gone (its session ended).", "info");
  }
}
const refreshSoon = throttle(refresh, 100);

function bytesOf(b64) {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

async function readOutput() {
  let skipToLine = false;
  if (task.output_bytes > TAIL_START) {
    offset = task.output_bytes - TAIL_START;
    skipToLine = true;
    transcript.note(`… the first ${formatBytes(offset)} of output are not shown here (download the output for all of it)`);
  }
  for (;;) {
    await visible();
    let body;
    try {
      const query = `offset=${offset}&limit=${CHUNK}&encoding=base64&wait_s=25`;
      body = await api(`${taskPath(sid, tid, "/output")}?${query}`);
    } catch (err) {
      if (err.status === 404 || err.status === 401) return;
      await new Promise((resolve) => setTimeout(resolve, 2000));
      continue;
    }
    let bytes = bytesOf(body.data_b64);
    if (skipToLine && bytes.length) {
      // Started mid-file: begin at the next whole line.
      const newline = bytes.indexOf(10);
      bytes = newline < 0 ? bytes.subarray(bytes.length) : bytes.subarray(newline + 1);
      if (newline >= 0) skipToLine = false;
    }
    transcript.feed(bytes);
    offset = body.next_offset;
    box.dataset.offset = String(offset);
    document.getElementById("size").textContent = formatBytes(Math.max(task.output_bytes, offset));
    if (body.eof) {
      transcript.end();
      box.dataset.eof = "true";
      return;
    }
    if (task.output_bytes - offset > FAR_BEHIND) {
      const skipped = task.output_bytes - TAIL_START - offset;
      offset += skipped;
      skipToLine = true;
      transcript.skip(`… ${formatBytes(skipped)} of output skipped to keep up (it is in the file)`);
    }
  }
}

stopButton.addEventListener("click", async () => {
  stopButton.disabled = true;
  stopButton.textContent = "Stopping…";
  try {
    task = await post(taskPath(sid, tid, "/stop"));
  } catch (err) {
    if (err.code !== "task_not_running") notice(`Could not stop the task: ${err.message}`);
  }
  stopButton.textContent = "Stop";
  await refresh();
});

form.addEventListener("submit", async (e) => {
  e.preventDefault();
  const line = input.value;
  inputState.textContent = "sending…";
  try {
    await post(taskPath(sid, tid, "/input"), { text: `${line}\n` });
    input.value = "";
    inputState.textContent = `sent: ${line}`;
  } catch (err) {
    inputState.textContent = `not sent: ${err.message}`;
  }
  await refresh();
});

document.getElementById("download").href = withToken(taskPath(sid, tid, "/output/file"));

async function main() {
  try {
    task = await api(taskPath(sid, tid));
  } catch (err) {
    notice(`Could not read the task: ${err.message}`);
    return;
  }
  document.getElementById("command").textContent = visibleText(task.command);
  render();
  const session = await api(`/sessions/${encodeURIComponent(sid)}`);
  let cursor = session.last_seq;
  readOutput();
  await events.start(0);
  new LiveStream(() => `/sessions/${encodeURIComponent(sid)}/events/stream?after=${cursor}&task_id=${tid}`, {
    types: EVENT_TYPES,
    onevent: (ev, seq) => {
      if (seq) cursor = Math.max(cursor, seq);
      if (LIFECYCLE.includes(ev.type)) refreshSoon();
      if (ev.type !== "task.started") events.update();
    },
    onopen: refreshSoon,
  }).start();
}

main();
setInterval(() => {
  if (!task || isFinal(task) || !task.started_at) return;
  const node = document.getElementById("running");
  if (node) node.textContent = formatElapsed(runningMs(task));
}, 1000);
setInterval(() => {
  if (!document.hidden && task && !isFinal(task)) refresh();
}, 2000);

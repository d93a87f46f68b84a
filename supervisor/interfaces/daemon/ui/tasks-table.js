// The task table: one row per task, sortable by any column, filtered by text and state,
// updated in place (a row is rebuilt only when what it shows changed; rows are moved only
// when the order changed), at most ``maxRows`` rows in the page.

import {
  badges,
  describeEnd,
  el,
  formatBytes,
  formatElapsed,
  isFinal,
  post,
  runningMs,
  sessionPage,
  statusClass,
  taskPage,
  taskPath,
} from "./common.js";
import { visibleText } from "./ansi.js";

const COLUMNS = [
  { key: "task_id", label: "ID", value: (t) => t.task_id },
  { key: "session_id", label: "Session", value: (t) => t.session_id, session: true },
  { key: "description", label: "Description", value: (t) => t.description.toLowerCase() },
  { key: "command", label: "Command", value: (t) => t.command },
  { key: "policy", label: "Policy", value: (t) => t.policy },
  { key: "runtime", label: "Runtime", value: (t) => t.runtime || "" },
  { key: "status", label: "Status", value: (t) => describeEnd(t) },
  { key: "exit_code", label: "Exit", value: (t) => (t.exit_code ?? -Infinity), numeric: true },
  { key: "running", label: "Running", value: (t) => runningMs(t), numeric: true },
  { key: "output", label: "Output", value: (t) => t.output_bytes, numeric: true },
  { key: "created", label: "Started", value: (t) => t.created_at, numeric: true },
  { key: "badges", label: "", value: null },
  { key: "actions", label: "", value: null },
];

const STATES = {
  all: () => true,
  active: (t) => !isFinal(t),
  waiting: (t) => t.stalled && !isFinal(t),
  completed: (t) => t.status === "completed",
  failed: (t) => t.status === "failed",
  killed: (t) => t.status === "killed",
};

/** What a row shows, as one string: the row is rebuilt only when it changes. */
function signature(t) {
  return [
    t.status, t.reason, t.exit_code, t.stalled, t.output_bytes, t.description, t.error,
    t.started_at, t.ended_at,
  ].join("\u0000");
}

export class TaskTable {
  constructor(table, { showSession = false, maxRows = 500, onchange = null, stateSelect, filterInput, countLabel }) {
    this.table = table;
    this.columns = COLUMNS.filter((c) => showSession || !c.session);
    this.maxRows = maxRows;
    this.onchange = onchange;
    this.tasks = new Map();
    this.rows = new Map();
    this.sortKey = "created";
    this.sortDir = -1; // newest first
    this.filter = "";
    this.state = "all";
    this.countLabel = countLabel;
    this.pending = false;
    this.tbody = el("tbody");
    this.buildHead();
    table.replaceChildren(this.thead, this.tbody);
    if (filterInput) {
      filterInput.addEventListener("input", () => {
        this.filter = filterInput.value.trim().toLowerCase();
        this.schedule();
      });
    }
    if (stateSelect) {
      stateSelect.addEventListener("change", () => {
        this.state = stateSelect.value;
        this.schedule();
      });
    }
  }

  buildHead() {
    const row = el("tr");
    for (const col of this.columns) {
      const th = el("th", { dataset: { col: col.key } }, col.label);
      if (col.value) {
        th.classList.add("sortable");
        th.tabIndex = 0;
        const sort = () => {
          if (this.sortKey === col.key) this.sortDir = -this.sortDir;
          else {
            this.sortKey = col.key;
            this.sortDir = col.numeric ? -1 : 1;
          }
          this.schedule();
        };
        th.addEventListener("click", sort);
        th.addEventListener("keydown", (e) => e.key === "Enter" && sort());
      }
      row.append(th);
    }
    this.thead = el("thead", {}, row);
  }

  setAll(list) {
    this.tasks = new Map(list.map((t) => [t.task_id, t]));
    this.schedule();
  }

  upsert(task) {
    this.tasks.set(task.task_id, task);
    this.schedule();
  }

  removeSession(sid) {
    for (const [id, t] of this.tasks) if (t.session_id === sid) this.tasks.delete(id);
    this.schedule();
  }

  get(id) {
    return this.tasks.get(id);
  }

  hasActive() {
    for (const t of this.tasks.values()) if (!isFinal(t)) return true;
    return false;
  }

  /** Renders at the next frame, once, however many updates came meanwhile. */
  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  visibleTasks() {
    const keep = STATES[this.state] || STATES.all;
    const text = this.filter;
    const col = COLUMNS.find((c) => c.key === this.sortKey) || COLUMNS[0];
    const list = [];
    for (const t of this.tasks.values()) {
      if (!keep(t)) continue;
      if (text) {
        const hay = [t.task_id, t.session_id, t.description, t.command, t.policy, describeEnd(t),
          t.stalled ? "waiting for input" : "", t.kind, t.persistent ? "persistent" : ""].join(" ").toLowerCase();
        if (!hay.includes(text)) continue;
      }
      list.push(t);
    }
    list.sort((a, b) => {
      const x = col.value(a);
      const y = col.value(b);
      const order = x < y ? -1 : x > y ? 1 : a.created_at - b.created_at;
      return order * this.sortDir;
    });
    return list;
  }

  render() {
    const list = this.visibleTasks();
    const shown = list.slice(0, this.maxRows);
    const keep = new Set();
    let position = 0;
    for (const task of shown) {
      keep.add(task.task_id);
      let row = this.rows.get(task.task_id);
      const sig = signature(task);
      if (!row) {
        row = { tr: el("tr", { dataset: { taskId: task.task_id } }), sig: null };
        this.rows.set(task.task_id, row);
      }
      if (row.sig !== sig) {
        this.fill(row.tr, task);
        row.sig = sig;
      }
      const at = this.tbody.children[position];
      if (at !== row.tr) this.tbody.insertBefore(row.tr, at || null);
      position += 1;
    }
    for (const [id, row] of this.rows) {
      if (!keep.has(id)) {
        row.tr.remove();
        this.rows.delete(id);
      }
    }
    for (const th of this.thead.querySelectorAll("th")) {
      th.classList.toggle("asc", th.dataset.col === this.sortKey && this.sortDir > 0);
      th.classList.toggle("desc", th.dataset.col === this.sortKey && this.sortDir < 0);
    }
    if (this.countLabel) {
      const total = this.tasks.size;
      let text = `${total} task${total === 1 ? "" : "s"}`;
      if (list.length !== total) text += `, ${list.length} shown`;
      if (list.length > shown.length) text += ` (the first ${shown.length}: refine the filter)`;
      this.countLabel.textContent = text;
    }
    if (this.onchange) this.onchange(this.tasks);
  }

  fill(tr, t) {
    tr.className = statusClass(t);
    const cells = [];
    for (const col of this.columns) {
      const td = el("td", { dataset: { col: col.key } });
      switch (col.key) {
        case "task_id":
          td.append(el("a", { href: taskPage(t.session_id, t.task_id), class: "mono" }, t.task_id));
          break;
        case "session_id":
          td.append(el("a", { href: sessionPage(t.session_id) }, t.session_id));
          break;
        case "description":
          td.textContent = visibleText(t.description || "");
          td.title = visibleText(t.description || "");
          break;
        case "command":
          td.className = "mono cmd";
          td.textContent = visibleText(t.command);
          td.title = visibleText(t.command);
          break;
        case "policy":
          td.textContent = t.policy;
          break;
        case "runtime":
          td.textContent = t.runtime === "runsc" ? "gVisor" : t.runtime || "-";
          break;
        case "status":
          td.textContent = describeEnd(t);
          if (t.error && isFinal(t)) td.title = t.error;
          break;
        case "exit_code":
          td.className = "num";
          td.textContent = t.exit_code ?? "-";
          break;
        case "running":
          td.className = "num";
          td.textContent = t.started_at ? formatElapsed(runningMs(t)) : "-";
          break;
        case "output":
          td.className = "num";
          td.textContent = formatBytes(t.output_bytes);
          break;
        case "created":
          td.className = "num";
          td.textContent = new Date(t.created_at * 1000).toLocaleTimeString([], { hour12: false });
          break;
        case "badges":
          td.append(...badges(t));
          break;
        case "actions":
          if (!isFinal(t)) td.append(this.stopButton(t));
          break;
        default:
          break;
      }
      cells.push(td);
    }
    tr.replaceChildren(...cells);
  }

  stopButton(t) {
    const button = el("button", { class: "stop small", type: "button", title: "SIGTERM, then SIGKILL after the grace period" }, "Stop");
    button.addEventListener("click", async () => {
      button.disabled = true;
      button.textContent = "stopping…";
      try {
        this.upsert(await post(taskPath(t.session_id, t.task_id, "/stop")));
      } catch (err) {
        if (err.code === "task_not_running" && err.status === 409) return;
        button.disabled = false;
        button.textContent = "Stop";
      }
    });
    return button;
  }

  /** Once a second: the running time of tasks that run. */
  tick() {
    for (const [id, row] of this.rows) {
      const t = this.tasks.get(id);
      if (!t || isFinal(t) || !t.started_at) continue;
      const cell = row.tr.querySelector('td[data-col="running"]');
      if (cell) cell.textContent = formatElapsed(runningMs(t));
    }
  }
}

// A session's notifications in order: the <task-notification> and <background_task_poll>
// blocks exactly as the agent reads them (rendered by the daemon, shown as text), newest at
// the bottom, at most ``maxItems`` in the page. Fetched from the notifications API when the
// event stream says something new happened.

import { api, ApiError, el, formatTime, taskPage, throttle } from "./common.js";

/** Polls and monitor lines: many, and hidden on request. */
const NOISE = new Set(["task.poll", "task.output", "task.output_suppressed"]);
const LABEL = {
  "task.stopped": "ended",
  "task.failed": "failed to start",
  "task.stalled": "waiting for input",
  "task.poll": "poll",
  "task.output": "monitor output",
  "task.output_suppressed": "monitor output suppressed",
};

export class Timeline {
  constructor(list, sid, { taskId = null, maxItems = 300, showTask = true, page = 1000 } = {}) {
    this.page = page;
    this.list = list;
    this.sid = sid;
    this.taskId = taskId;
    this.maxItems = maxItems;
    this.showTask = showTask;
    this.cursor = 0;
    this.count = 0;
    this.following = true;
    list.addEventListener("scroll", () => {
      this.following = list.scrollHeight - list.scrollTop - list.clientHeight < 8;
    });
    this.update = throttle(() => this.fetch(), 250);
  }

  /** Start after ``seq`` (the most recent events of a long session, not all of them). */
  async start(after) {
    this.cursor = after;
    await this.fetch();
  }

  async fetch() {
    for (;;) {
      const query = new URLSearchParams({ format: "json", after: String(this.cursor), limit: String(this.page) });
      if (this.taskId) query.set("task_id", this.taskId);
      let body;
      try {
        body = await api(`/sessions/${encodeURIComponent(this.sid)}/notifications?${query}`);
      } catch (err) {
        // The session ended and is gone (404) while the page was open: keep what is shown.
        if (err instanceof ApiError && err.status === 404) return;
        throw err;
      }
      this.append(body.notifications);
      const read = body.last_seq - this.cursor;
      this.cursor = body.last_seq;
      if (read < this.page) return;
    }
  }

  append(items) {
    if (!items.length) return;
    const fragment = document.createDocumentFragment();
    for (const item of items.slice(-this.maxItems)) fragment.append(this.item(item));
    this.list.append(fragment);
    this.count += Math.min(items.length, this.maxItems);
    while (this.count > this.maxItems && this.list.firstChild) {
      this.list.firstChild.remove();
      this.count -= 1;
    }
    if (this.following) this.list.scrollTop = this.list.scrollHeight;
  }

  item(n) {
    const ev = n.event;
    const head = el(
      "div",
      { class: "head" },
      el("span", { class: "seq" }, `#${n.seq}`),
      el("span", { class: "time" }, formatTime(ev.ts)),
      el("span", { class: `kind k-${n.type.replace(".", "-")}` }, LABEL[n.type] || n.type),
      this.showTask && n.task_id ? el("a", { href: taskPage(this.sid, n.task_id), class: "mono" }, n.task_id) : null,
      n.summary ? el("span", { class: "summary" }, n.summary) : null,
    );
    return el(
      "li",
      { class: NOISE.has(n.type) ? "note noise" : "note", dataset: { seq: String(n.seq), type: n.type } },
      head,
      el("pre", { class: "xml" }, n.xml || ""),
    );
  }
}

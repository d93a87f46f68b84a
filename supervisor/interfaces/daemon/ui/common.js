// What every page of the dashboard shares: the API (through the login cookie), live streams
// that let go of their connection while the tab is hidden, DOM building that never parses
// HTML, and the texts the CLI uses for a task's state (kept in step with core/text.py).

export const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
export const TASK_ID = /^[a-z]+-[0-9a-f]{8,32}$/;

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

/** The banner's first line while the engine is not up (the codes a start fails with). */
const ENGINE_HEADLINES = {
  wedged: "Docker engine wedged: starts are refused with engine_unresponsive until it answers",
  down: "Docker engine down: starts fail with engine_unavailable until it answers again",
};

/**
 * The engine banner at the top of the page, from an ``engine.state`` event of the page's
 * stream: hidden while the engine is up; else what starts meet, the version (the admin's
 * login only) and why, and the note on a version with known deadlocks. Text nodes only.
 */
function showEngine(status) {
  const box = document.getElementById("engine-banner");
  if (!box) return;
  const up = status.state === "up";
  box.hidden = up;
  box.dataset.state = status.state;
  if (up) {
    box.replaceChildren();
    return;
  }
  const why = [status.version ? `Docker ${status.version}` : null, status.detail].filter(Boolean).join(": ");
  const parts = [el("strong", {}, ENGINE_HEADLINES[status.state] || `Docker engine ${status.state}`)];
  if (why) parts.push(el("div", { class: "engine-why" }, why));
  if (status.warning) parts.push(el("div", { class: "engine-warning" }, `This engine version: ${status.warning}`));
  box.replaceChildren(...parts);
}

/** Shows a line at the top of the page (a lost login, a failed request). */
export function notice(text, kind = "error") {
  const box = document.getElementById("notice");
  if (!box) return;
  box.textContent = text;
  box.className = `notice ${kind}`;
  box.hidden = !text;
}

/**
 * The login's CSRF token, sent with every API request. The cookie alone opens only the
 * pages: browsers send it to every port of this host, so another local server could replay
 * it. The login page hands the token over in the address's fragment (never sent to a
 * server); it is kept in localStorage, which is this origin's alone (port included), and
 * dropped from the address at once. EventSource and download links cannot send a header:
 * they carry it as the ``sandvisor_csrf`` query parameter (withToken).
 */
const CSRF_KEY = "sandvisor.csrf";
const CSRF_HEADER = "X-Sandvisor-CSRF";
/** The token when localStorage is unavailable (this page only). */
let csrfInMemory = null;

function takeCsrfFromAddress() {
  const found = /^#csrf=([A-Za-z0-9_-]{1,200})$/.exec(location.hash);
  if (!found) return;
  csrfInMemory = found[1];
  try {
    localStorage.setItem(CSRF_KEY, found[1]);
  } catch {
    // storage disabled: this page keeps it in memory
  }
  history.replaceState(history.state, "", location.pathname + location.search);
}
takeCsrfFromAddress();

function csrfToken() {
  try {
    return localStorage.getItem(CSRF_KEY) || csrfInMemory;
  } catch {
    return csrfInMemory;
  }
}

function withQuery(url, name, value) {
  return `${url}${url.includes("?") ? "&" : "?"}${name}=${encodeURIComponent(value)}`;
}

/** ``url`` with the login's CSRF token as a query parameter (for EventSource and links). */
export function withToken(url) {
  const token = csrfToken();
  return token ? withQuery(url, "sandvisor_csrf", token) : url;
}

function forgetCsrf() {
  csrfInMemory = null;
  try {
    localStorage.removeItem(CSRF_KEY);
  } catch {
    // nothing stored
  }
}

/** Set once this page logged out: its refreshes stop saying "no longer logged in". */
let loggedOut = false;
/** The page's live streams, closed when it logs out. */
const streams = new Set();

/** JSON from the API; throws ApiError with the API's error code. */
export async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const token = csrfToken();
  if (token) headers[CSRF_HEADER] = token;
  const response = await fetch(path, { credentials: "same-origin", ...options, headers });
  if (response.status === 401 && !loggedOut) {
    notice("This browser is no longer logged in: open a new login link (`sandvisor ui` prints one).");
  }
  if (!response.ok) {
    let code = "http_error";
    let message = `HTTP ${response.status}`;
    try {
      const body = await response.json();
      code = body.error.code;
      message = body.error.message;
    } catch {
      // not JSON: keep the status
    }
    if (code === "forbidden_csrf" && !loggedOut) {
      notice("This page lost its login's CSRF token: open a new login link (`sandvisor ui` prints one).");
    }
    throw new ApiError(response.status, code, message);
  }
  if (response.status === 204) return null;
  return response.json();
}

export function post(path, body = {}) {
  return api(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
}

export function taskPath(sid, tid, tail = "") {
  return `/sessions/${encodeURIComponent(sid)}/tasks/${encodeURIComponent(tid)}${tail}`;
}

export function taskPage(sid, tid) {
  return `/ui${taskPath(sid, tid)}`;
}

export function sessionPage(sid) {
  return `/ui/sessions/${encodeURIComponent(sid)}`;
}

/**
 * An element with attributes and children. Strings become text nodes: nothing here parses
 * HTML, so text from a task (its command, output, description) can never become markup.
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// -- texts (core/text.py) ------------------------------------------------------------------

export const FINAL = new Set(["completed", "failed", "killed"]);

export function isFinal(task) {
  return FINAL.has(task.status);
}

/** ``describe_end``: "completed, exit code 0", "killed, user stopped", "failed: <error>". */
export function describeEnd(task) {
  if (!isFinal(task)) return task.status;
  if (task.reason === null || task.reason === undefined) {
    return `${task.status}: ${task.error || "never ran"}`;
  }
  if (task.reason === "exit") return `${task.status}, exit code ${task.exit_code}`;
  return `${task.status}, ${task.reason.replaceAll("_", " ")}`;
}

/** ``format_elapsed``: 850ms, 12.3s, 4m05s, 2h03m. */
export function formatElapsed(ms) {
  if (ms === null || ms === undefined) return "-";
  ms = Math.max(0, Math.round(ms));
  if (ms < 1000) return `${ms}ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)}s`;
  const s = Math.floor(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

export function formatBytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(n < 10 ? 1 : 0) : n} ${units[i]}`;
}

export function formatTime(epoch) {
  if (!epoch) return "-";
  return new Date(epoch * 1000).toLocaleTimeString([], { hour12: false });
}

/** How long a task has run: final once it ended, counted on from its start while it runs. */
export function runningMs(task) {
  if (isFinal(task) || !task.started_at) return task.running_ms;
  return Math.max(task.running_ms, Date.now() - task.started_at * 1000);
}

/** The badges of a task: waiting for input, monitor, persistent. */
export function badges(task) {
  const out = [];
  if (task.stalled && !isFinal(task)) {
    out.push(el("span", { class: "badge stalled", title: "It appears to wait for input on stdin" }, "waiting for input"));
  }
  if (task.kind === "monitor") out.push(el("span", { class: "badge monitor" }, "monitor"));
  if (task.persistent) out.push(el("span", { class: "badge persistent" }, "persistent"));
  return out;
}

export function statusClass(task) {
  if (task.stalled && !isFinal(task)) return "st-stalled";
  return `st-${task.status}`;
}

// -- live --------------------------------------------------------------------------------

/**
 * An EventSource that exists only while the tab is visible: browsers allow six connections
 * per host, and a hidden tab should not hold one. ``url()`` is asked at each (re)connect, so
 * a page can resume from its own cursor; ``onopen`` runs after each connect (a page without
 * a cursor reads its state again there). Every stream also carries the engine's state
 * (``engine=true``: at each connect, then each change), which feeds the engine banner.
 */
export class LiveStream {
  constructor(url, { onevent, onopen, types = [] }) {
    this.url = url;
    this.onevent = onevent;
    this.onopen = onopen;
    this.types = types;
    this.source = null;
    this.closed = false;
    streams.add(this);
    document.addEventListener("visibilitychange", () => this.sync());
  }

  start() {
    this.sync();
    return this;
  }

  sync() {
    if (this.closed || document.hidden) {
      this.disconnect();
    } else if (!this.source) {
      this.connect();
    }
  }

  connect() {
    const source = new EventSource(withToken(withQuery(this.url(), "engine", "true")));
    this.source = source;
    source.onopen = () => {
      setState("live");
      if (this.onopen) this.onopen();
    };
    source.onerror = () => {
      setState(source.readyState === EventSource.CLOSED ? "offline" : "reconnecting");
      if (source.readyState === EventSource.CLOSED) {
        // The browser gave up (the daemon stopped, or the login ended): try again later.
        this.source = null;
        setTimeout(() => this.sync(), 3000);
      }
    };
    const handler = (message) => {
      let event;
      try {
        event = JSON.parse(message.data);
      } catch {
        return;
      }
      this.onevent(event, Number(message.lastEventId), message.type);
    };
    for (const type of this.types) source.addEventListener(type, handler);
    source.addEventListener("engine.state", (message) => {
      try {
        showEngine(JSON.parse(message.data));
      } catch {
        // not JSON: keep the banner as it was
      }
    });
  }

  disconnect() {
    if (this.source) {
      this.source.close();
      this.source = null;
    }
  }

  close() {
    this.closed = true;
    streams.delete(this);
    this.disconnect();
  }
}

export const EVENT_TYPES = [
  "task.started",
  "task.output",
  "task.output_suppressed",
  "task.poll",
  "task.stalled",
  "task.stopped",
  "task.failed",
  "session.ended",
  "events.gap",
];
export const LIFECYCLE = ["task.started", "task.stalled", "task.stopped", "task.failed", "session.ended"];

function setState(state) {
  const node = document.getElementById("live-state");
  if (!node) return;
  node.textContent = state;
  node.className = `live-state ${state}`;
}

/** Runs ``fn`` at most once per ``ms``, the last call winning (trailing edge). */
export function throttle(fn, ms) {
  let timer = null;
  let again = false;
  const run = async () => {
    again = false;
    try {
      await fn();
    } finally {
      timer = setTimeout(() => {
        timer = null;
        if (again) schedule();
      }, ms);
    }
  };
  const schedule = () => {
    if (timer) {
      again = true;
    } else {
      timer = -1;
      run();
    }
  };
  return schedule;
}

/** Resolves once the tab is visible (at once when it is). */
export function visible() {
  if (!document.hidden) return Promise.resolve();
  return new Promise((resolve) => {
    const check = () => {
      if (!document.hidden) {
        document.removeEventListener("visibilitychange", check);
        resolve();
      }
    };
    document.addEventListener("visibilitychange", check);
  });
}

/** The header every page has: where you are, the stream's state, logging out. */
export function header(crumbs) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren();
  crumbs.forEach(([label, href], i) => {
    if (i) nav.append(el("span", { class: "sep" }, "/"));
    nav.append(href ? el("a", { href }, label) : el("span", { class: "here" }, label));
  });
  const logout = document.getElementById("logout");
  logout.addEventListener("click", async () => {
    loggedOut = true;
    for (const stream of [...streams]) stream.close();
    try {
      await post("/ui/logout");
    } finally {
      forgetCsrf();
      notice("Logged out. Open a new login link (`sandvisor ui` prints one) to come back.", "info");
      setState("offline");
    }
  });
}

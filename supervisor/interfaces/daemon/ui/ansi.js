// Terminal output to DOM nodes: SGR colours and styles become spans, every other escape
// sequence is dropped, and characters that could hide or reorder text (C0, DEL, C1,
// bidirectional overrides, invisible format characters) are shown as visible \xNN /
// \uNNNN marks. Text only ever becomes text nodes.

// CSI (parameters, intermediates, final), OSC (to BEL or ST), other two-byte escapes, a lone ESC.
const ESCAPE = /\x1b(?:\[([0-?]*)[ -/]*([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_]|$)/g;
// What is left after escapes are taken out that must not reach the page as is: the set of
// supervisor/core/visible.py (the notifications use it; a unit test keeps the two equal)
// but tab and newline. C0, DEL, C1, bidi marks, embeddings, overrides and isolates, and
// every other invisible format character (Cf) except the joiners U+200C, U+200D.
const UNSAFE = /[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb\ufffe\uffff\u{110bd}\u{110cd}\u{13430}-\u{1343f}\u{1bca0}-\u{1bca3}\u{1d173}-\u{1d17a}\u{e0001}\u{e0020}-\u{e007f}]/gu;

/** How core/visible.py spells a character: \xNN, \uNNNN or \UNNNNNNNN. */
function hex(code) {
  if (code < 0x100) return `\\x${code.toString(16).padStart(2, "0")}`;
  if (code < 0x10000) return `\\u${code.toString(16).padStart(4, "0")}`;
  return `\\U${code.toString(16).padStart(8, "0")}`;
}

const CUBE = [0, 95, 135, 175, 215, 255];

/** An xterm 256-colour index as rgb() (0-15 are left to the stylesheet's palette). */
function color256(n) {
  if (n < 16) return null;
  if (n < 232) {
    const i = n - 16;
    return `rgb(${CUBE[Math.floor(i / 36)]},${CUBE[Math.floor(i / 6) % 6]},${CUBE[i % 6]})`;
  }
  const v = 8 + (n - 232) * 10;
  return `rgb(${v},${v},${v})`;
}

/** The SGR state; it carries over from line to line, as in a terminal. */
export class AnsiState {
  constructor() {
    this.reset();
  }

  reset() {
    this.fg = null; // palette index 0-15, or an rgb() string
    this.bg = null;
    this.bold = false;
    this.dim = false;
    this.italic = false;
    this.underline = false;
    this.inverse = false;
    this.strike = false;
  }

  plain() {
    return (
      this.fg === null && this.bg === null && !this.bold && !this.dim && !this.italic &&
      !this.underline && !this.inverse && !this.strike
    );
  }

  apply(params) {
    const codes = params === "" ? [0] : params.split(/[;:]/).map((p) => (p === "" ? 0 : Number(p)));
    for (let i = 0; i < codes.length; i++) {
      const c = codes[i];
      if (c === 0) this.reset();
      else if (c === 1) this.bold = true;
      else if (c === 2) this.dim = true;
      else if (c === 3) this.italic = true;
      else if (c === 4) this.underline = true;
      else if (c === 7) this.inverse = true;
      else if (c === 9) this.strike = true;
      else if (c === 22) this.bold = this.dim = false;
      else if (c === 23) this.italic = false;
      else if (c === 24) this.underline = false;
      else if (c === 27) this.inverse = false;
      else if (c === 29) this.strike = false;
      else if (c >= 30 && c <= 37) this.fg = c - 30;
      else if (c === 39) this.fg = null;
      else if (c >= 40 && c <= 47) this.bg = c - 40;
      else if (c === 49) this.bg = null;
      else if (c >= 90 && c <= 97) this.fg = c - 90 + 8;
      else if (c >= 100 && c <= 107) this.bg = c - 100 + 8;
      else if (c === 38 || c === 48) {
        let value = null;
        if (codes[i + 1] === 5 && i + 2 < codes.length) {
          const n = codes[i + 2];
          value = n < 16 ? n : color256(n);
          i += 2;
        } else if (codes[i + 1] === 2 && i + 4 < codes.length) {
          const [r, g, b] = codes.slice(i + 2, i + 5).map((v) => Math.min(255, Math.max(0, v)));
          value = `rgb(${r},${g},${b})`;
          i += 4;
        } else {
          break; // malformed: ignore the rest, as terminals do
        }
        if (c === 38) this.fg = value;
        else this.bg = value;
      }
    }
  }

  span(text) {
    if (this.plain()) return document.createTextNode(text);
    const span = document.createElement("span");
    const classes = [];
    let fg = this.fg;
    let bg = this.bg;
    if (this.inverse) {
      [fg, bg] = [bg, fg];
      if (fg === null) classes.push("inv-fg");
      if (bg === null) classes.push("inv-bg");
    }
    if (typeof fg === "number") classes.push(`fg${fg}`);
    else if (fg) span.style.color = fg; // the CSSOM, not a style attribute: CSP allows it
    if (typeof bg === "number") classes.push(`bg${bg}`);
    else if (bg) span.style.backgroundColor = bg;
    if (this.bold) classes.push("b");
    if (this.dim) classes.push("dim");
    if (this.italic) classes.push("i");
    if (this.underline) classes.push("u");
    if (this.strike) classes.push("s");
    span.className = classes.join(" ");
    span.textContent = text;
    return span;
  }
}

/** Text a task chose (a command, a description, a path) with every unsafe character as a
 * visible mark; escape sequences stay visible too (ESC shows as \x1b). */
export function visibleText(text) {
  return text.replace(UNSAFE, (ch) => hex(ch.codePointAt(0)));
}

/** Plain text with unsafe characters as visible marks (for text shown outside a transcript). */
export function safeText(text) {
  return text.replace(ESCAPE, "").replace(UNSAFE, (ch) => hex(ch.codePointAt(0)));
}

/**
 * Appends one line of terminal output to ``parent``. A carriage return inside the line
 * means the rest overwrote it (progress bars): only the last part is kept.
 */
export function renderLine(parent, line, state) {
  if (line.endsWith("\r")) line = line.slice(0, -1);
  const cr = line.lastIndexOf("\r");
  if (cr >= 0) line = line.slice(cr + 1);
  let last = 0;
  ESCAPE.lastIndex = 0;
  for (let m = ESCAPE.exec(line); m; m = ESCAPE.exec(line)) {
    if (m.index > last) appendText(parent, line.slice(last, m.index), state);
    if (m[2] === "m") state.apply(m[1]);
    last = ESCAPE.lastIndex;
  }
  if (last < line.length) appendText(parent, line.slice(last), state);
}

function appendText(parent, text, state) {
  let last = 0;
  UNSAFE.lastIndex = 0;
  for (let m = UNSAFE.exec(text); m; m = UNSAFE.exec(text)) {
    if (m.index > last) parent.append(state.span(text.slice(last, m.index)));
    const mark = document.createElement("span");
    mark.className = "ctl";
    mark.textContent = hex(m[0].codePointAt(0));
    parent.append(mark);
    last = m.index + m[0].length;
  }
  if (last < text.length) parent.append(state.span(text.slice(last)));
}

/** The SGR state after ``line``, without drawing it (for lines that will not be shown). */
export function advanceState(line, state) {
  ESCAPE.lastIndex = 0;
  for (let m = ESCAPE.exec(line); m; m = ESCAPE.exec(line)) {
    if (m[2] === "m") state.apply(m[1]);
  }
}

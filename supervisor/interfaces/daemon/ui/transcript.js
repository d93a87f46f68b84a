// A task's live transcript (seed 002's "native mirror"): output arrives as bytes at offsets
// and is shown line by line. A partial line is held until its newline comes, and flushed
// when the task ends. The page holds at most ``maxLines`` lines (the file holds them all);
// it follows the tail unless the reader scrolled up.

import { AnsiState, advanceState, renderLine } from "./ansi.js";
import { el } from "./common.js";

/** A line longer than this without a newline is shown in pieces (memory stays bounded). */
const MAX_PENDING = 64 * 1024;

export class Transcript {
  constructor(box, { maxLines = 5000, jump = null } = {}) {
    this.box = box;
    this.lines = el("div", { class: "lines" });
    box.append(this.lines);
    this.maxLines = maxLines;
    this.decoder = new TextDecoder("utf-8");
    this.pending = "";
    this.state = new AnsiState();
    this.count = 0; // lines in the page
    this.dropped = 0; // lines taken out of the page (still in the file)
    this.following = true;
    this.ended = false;
    this.jump = jump;
    this.droppedNote = null;
    box.addEventListener("scroll", () => {
      // Within a few pixels of the bottom counts as "at the tail".
      const atTail = box.scrollHeight - box.scrollTop - box.clientHeight < 8;
      this.following = atTail;
      if (this.jump) this.jump.hidden = atTail;
    });
    if (jump) {
      jump.addEventListener("click", () => {
        this.following = true;
        jump.hidden = true;
        this.scroll();
      });
    }
  }

  /** A marker line of our own (not output): output skipped, or earlier output not shown. */
  note(text) {
    this.lines.append(el("div", { class: "line note" }, text));
    this.count += 1;
    this.trim();
    this.scroll();
  }

  /** Output was skipped (a reader far behind a fast writer): drop the held partial line. */
  skip(text) {
    this.decoder = new TextDecoder("utf-8");
    this.pending = "";
    this.note(text);
  }

  /** Feed bytes as read from the output file. */
  feed(bytes) {
    this.pending += this.decoder.decode(bytes, { stream: true });
    const cut = this.pending.lastIndexOf("\n");
    let lines = [];
    if (cut >= 0) {
      lines = this.pending.slice(0, cut).split("\n");
      this.pending = this.pending.slice(cut + 1);
    }
    const pieces = [];
    while (this.pending.length > MAX_PENDING) {
      pieces.push(this.pending.slice(0, MAX_PENDING));
      this.pending = this.pending.slice(MAX_PENDING);
    }
    this.append(lines, pieces);
  }

  /** The task ended and everything was read: the held partial line is shown now. */
  end() {
    if (this.ended) return;
    this.ended = true;
    this.pending += this.decoder.decode();
    if (this.pending) {
      this.append([this.pending], [], true);
      this.pending = "";
    }
  }

  append(lines, pieces, partial = false) {
    if (!lines.length && !pieces.length) return;
    const all = lines.map((text) => [text, ""]).concat(pieces.map((text) => [text, "cut"]));
    if (partial) all[all.length - 1][1] = "no-eol";
    // More lines than the page keeps: build only the ones that will stay.
    const skip = Math.max(0, all.length - this.maxLines);
    if (skip) {
      this.dropped += skip;
      // Colours set in the skipped lines still apply to the ones shown.
      for (let i = 0; i < skip; i++) advanceState(all[i][0], this.state);
    }
    const fragment = document.createDocumentFragment();
    for (let i = skip; i < all.length; i++) {
      const [text, kind] = all[i];
      const line = el("div", { class: kind ? `line ${kind}` : "line" });
      renderLine(line, text, this.state);
      if (!text) line.append("\u200b"); // an empty line keeps its height
      fragment.append(line);
    }
    this.lines.append(fragment);
    this.count += all.length - skip;
    this.trim();
    this.scroll();
  }

  trim() {
    const extra = this.count - this.maxLines;
    if (extra > 0) {
      for (let i = 0; i < extra && this.lines.firstChild; i++) this.lines.firstChild.remove();
      this.count -= extra;
      this.dropped += extra;
    }
    if (this.dropped && this.droppedNote) {
      this.droppedNote.textContent = `${this.dropped} earlier line(s) are not shown here; download the output for all of it.`;
      this.droppedNote.hidden = false;
    }
  }

  scroll() {
    if (this.following) this.box.scrollTop = this.box.scrollHeight;
    else if (this.jump) this.jump.hidden = false;
  }
}

"""Pure: turn a monitor task's stdout bytes into line-bounded ``task.output`` events.

- a trailing partial line is held until its newline arrives (flushed when the task ends);
- each chunk's ``ordinal`` is the 1-based index of its last line, so replays de-duplicate;
- a line longer than the chunk limit is split into pieces of fixed size (each piece counts
  as a line for ordinals, so the split is deterministic and ordinals strictly increase);
- lines are throttled: the first line after a quiet window goes out at once, later lines
  within ``batch_window_ms`` share one event;
- token buckets (lines and bytes) turn floods into ``task.output_suppressed`` events (never
  silent drops), coalesced: once a line is over budget, it and every later line are
  suppressed until the notice goes out, and during a flood at most one event of either kind
  goes out per window (at least 50 ms): the lines that passed, then the notice, in turn.
  A ``yes`` flood costs one small event per window, not one per read.
"""

from __future__ import annotations

from collections import deque

from supervisor.core.events import BaseEvent, TaskOutput, TaskOutputSuppressed
from supervisor.core.policy import Monitor


def _char_boundary(data: bytes, limit: int) -> int:
    """Largest cut <= limit that does not split a UTF-8 character (never 0)."""
    cut = limit
    while cut > limit - 4 and cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if cut > 0 else limit


class TokenBucket:
    """Classic token bucket; time is passed in (seconds, monotonic)."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, now: float = 0.0) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float, amount: float = 1.0) -> bool:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        if self.tokens >= amount:
            self.tokens -= amount
            return True
        return False


class LineChunker:
    """Feed bytes and timestamps; get events. No I/O, no clock of its own."""

    def __init__(self, cfg: Monitor, session_id: str, task_id: str) -> None:
        self.cfg = cfg
        self.session_id = session_id
        self.task_id = task_id
        self.window = cfg.batch_window_ms / 1000
        # Room for the separators: a chunk of pieces never exceeds max_chunk_bytes.
        self.piece = max(256, cfg.max_chunk_bytes - 1)
        self.ordinal = 0
        self._partial = bytearray()
        self._batch: list[bytes] = []
        self._batch_bytes = 0
        self._batch_started: float | None = None
        self._batch_ordinal = 0
        #: Whether the batch's last line ended with a newline / is a cut piece.
        self._batch_eol = True
        self._batch_cut = False
        self._last_emit = float("-inf")
        self._bucket = TokenBucket(cfg.lines_per_s, cfg.burst_lines)
        self._bytes = TokenBucket(cfg.bytes_per_s, cfg.burst_bytes)
        self._bucket_started = False
        #: From the first suppressed line until a chunk goes out with no suppression pending:
        #: one event per window, and no chunk is sent early for being full.
        self._flood = False
        self._suppressed = 0
        self._suppressed_first = 0
        self._suppressed_at = 0.0
        self._fed = 0
        self._floor = 0
        #: Stream offset just after the last counted line (or piece).
        self._counted = 0
        self._batch_end = 0
        self._suppressed_end = 0
        #: (ordinal, stream offset) of each event returned, in order: a restart that resumes
        #: from such a mark re-counts the same lines with the same ordinals.
        self.marks: deque[tuple[int, int]] = deque()

    @property
    def consumed(self) -> int:
        """Stream position just after the last line (or piece) counted in ``ordinal``."""
        return self._fed - len(self._partial)

    def resume(self, *, ordinal: int, offset: int, floor: int) -> None:
        """Continue after a restart: lines up to ``ordinal`` end at stream ``offset``; events
        for lines up to ``floor`` were already delivered and are not sent again."""
        self.ordinal = ordinal
        self._fed = offset
        self._counted = offset
        self._floor = floor

    # -- feeding -------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> list[BaseEvent]:
        if not self._bucket_started:
            self._bucket = TokenBucket(self.cfg.lines_per_s, self.cfg.burst_lines, now)
            self._bytes = TokenBucket(self.cfg.bytes_per_s, self.cfg.burst_bytes, now)
            self._bucket_started = True
        self._fed += len(data)
        out: list[BaseEvent] = []
        if self._suppressed:
            # A notice overdue (nobody ticked) goes out first, so new lines may pass again.
            self._emit_due(now, out)
        start = 0
        while True:
            if self._suppressed and not self._partial:
                start = self._suppress_bulk(data, start)
            nl = data.find(b"\n", start)
            if nl < 0:
                self._partial += data[start:]
                break
            if self._partial:
                self._partial += data[start:nl]
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = data[start:nl]
            self._line(line, True, now, out)
            start = nl + 1
        # An endless line must not sit in memory: emit full pieces as they complete.
        while len(self._partial) > self.piece:
            cut = _char_boundary(bytes(self._partial[: self.piece + 4]), self.piece)
            piece = bytes(self._partial[:cut])
            del self._partial[:cut]
            self._line(piece, False, now, out)
        self._emit_due(now, out)
        return out

    def _line(self, line: bytes, eol: bool, now: float, out: list[BaseEvent]) -> None:
        """Account one line (or one piece of an over-long line)."""
        # Pieces: split deterministically by size, each piece counts as a line.
        while len(line) > self.piece:
            cut = _char_boundary(line, self.piece)
            self._one(line[:cut], False, now, out)
            line = line[cut:]
        self._one(line, eol, now, out)

    def _one(self, segment: bytes, eol: bool, now: float, out: list[BaseEvent]) -> None:
        self.ordinal += 1
        self._counted += len(segment) + (1 if eol else 0)
        size = len(segment) + 1
        full = bool(self._batch) and (
            self._batch_cut or self._batch_bytes + size > self.cfg.max_chunk_bytes
        )
        # Once suppressing, keep suppressing until the notice is out: letting a line through
        # would need a notice now and a chunk now (the leak of issue 14: two events per read).
        if self._suppressed or (self._flood and full) or not self._within_budget(size - 1, now):
            if not self._suppressed:
                self._suppressed_first = self.ordinal
                self._suppressed_at = now
                self._flood = True
            self._suppressed += 1
            self._suppressed_end = self._counted
            return
        if full:
            out.extend(self._emit_batch(now))
        if not self._batch:
            self._batch_started = now
        self._batch.append(segment)
        self._batch_bytes += size
        self._batch_ordinal = self.ordinal
        self._batch_end = self._counted
        self._batch_eol = eol
        self._batch_cut = not eol
        if not eol and not self._flood:
            # A cut piece ends its chunk; the next chunk continues the line.
            out.extend(self._emit_batch(now))

    def _suppress_bulk(self, data: bytes, start: int) -> int:
        """Count the complete lines of ``data[start:]`` as suppressed without a Python step per
        line (a flood is millions of lines); stop before a line that must be cut in pieces."""
        last = data.rfind(b"\n", start)
        if last < 0:
            return start
        end = _first_long_line(data, start, last + 1, self.piece)
        if end == start:
            return start
        lines = data.count(b"\n", start, end)
        self.ordinal += lines
        self._counted += end - start
        self._suppressed += lines
        self._suppressed_end = self._counted
        return end

    def _within_budget(self, size: int, now: float) -> bool:
        """One line token and ``size`` byte tokens, or neither."""
        if not self._bucket.take(now):
            return False
        if self._bytes.take(now, float(size)):
            return True
        self._bucket.tokens += 1.0  # give the line token back
        return False

    # -- emitting ------------------------------------------------------------------

    def _emit_batch(self, now: float) -> list[BaseEvent]:
        if not self._batch:
            return []
        first = self._batch_ordinal - len(self._batch) + 1
        if self._floor >= first:
            # Replayed after a restart: drop lines already delivered before it.
            del self._batch[: min(len(self._batch), self._floor - first + 1)]
            if not self._batch:
                self._batch_bytes = 0
                self._batch_started = None
                return []
        text = b"\n".join(self._batch).decode("utf-8", "replace")
        self.marks.append((self._batch_ordinal, self._batch_end))
        ev = TaskOutput(
            session_id=self.session_id,
            task_id=self.task_id,
            text=text,
            ordinal=self._batch_ordinal,
            lines=len(self._batch),
            eol=self._batch_eol,
            cut=self._batch_cut,
        )
        self._batch = []
        self._batch_bytes = 0
        self._batch_started = None
        self._last_emit = now
        if not self._suppressed:
            self._flood = False  # these lines all passed: the flood, if any, is over
        return [ev]

    def _suppression(self) -> TaskOutputSuppressed | None:
        if self._suppressed_first + self._suppressed - 1 <= self._floor:
            self._suppressed = 0
            return None
        first = max(self._suppressed_first, self._floor + 1)
        self._suppressed -= first - self._suppressed_first
        self._suppressed_first = first
        self.marks.append((first + self._suppressed - 1, self._suppressed_end))
        ev = TaskOutputSuppressed(
            session_id=self.session_id,
            task_id=self.task_id,
            lines=self._suppressed,
            first_ordinal=self._suppressed_first,
            last_ordinal=self._suppressed_first + self._suppressed - 1,
        )
        self._suppressed = 0
        return ev

    @staticmethod
    def _append(out: list[BaseEvent], event: BaseEvent | None) -> None:
        if event is not None:
            out.append(event)

    def _gap(self) -> float:
        """Least time between two events: the window, and at least 50 ms during a flood."""
        return max(self.window, 0.05) if self._flood else self.window

    def next_flush_at(self) -> float | None:
        """When ``tick`` should next be called (loop time), or None."""
        if self._batch_started is not None:
            return max(self._batch_started, self._last_emit + self._gap())
        if self._suppressed:
            return max(self._suppressed_at, self._last_emit + max(self._gap(), 0.05))
        return None

    def _emit_due(self, now: float, out: list[BaseEvent]) -> None:
        """Emit what is due by ``now``, one event per due time: the held chunk first (its
        lines come before the suppressed ones), then the notice."""
        while (due := self.next_flush_at()) is not None and now + 1e-9 >= due:
            # A late caller gets the events stamped with the times they were due, so
            # catching up never shifts the schedule of the events that follow.
            if self._batch:
                out.extend(self._emit_batch(due))
            else:
                self._append(out, self._suppression())
                self._last_emit = due

    def tick(self, now: float) -> list[BaseEvent]:
        """Emit a batch whose window has passed, and any pending suppression summary."""
        out: list[BaseEvent] = []
        self._emit_due(now, out)
        return out

    def flush_all(self) -> list[BaseEvent]:
        """Task ended: emit everything, including a final line without newline."""
        out: list[BaseEvent] = []
        now = self._last_emit if self._last_emit != float("-inf") else 0.0
        if self._suppressed:
            out.extend(self._emit_batch(now))
            self._append(out, self._suppression())
        if self._partial:
            # The final line is always delivered (bypassing the rate limit): it is often
            # the task's last word, and it is one line.
            line = bytes(self._partial)
            self._partial.clear()
            self.ordinal += 1
            self._counted += len(line)
            if self._batch and (
                self._batch_cut or self._batch_bytes + len(line) + 1 > self.cfg.max_chunk_bytes
            ):
                out.extend(self._emit_batch(now))
            if not self._batch:
                self._batch_started = now
            self._batch.append(line)
            self._batch_bytes += len(line) + 1
            self._batch_ordinal = self.ordinal
            self._batch_end = self._counted
            self._batch_eol = self._batch_cut = False
        out.extend(self._emit_batch(now))
        return out


def _first_long_line(data: bytes, start: int, end: int, limit: int) -> int:
    """Start of the first line in ``data[start:end]`` (whole lines) longer than ``limit``
    bytes, or ``end``. Steps a window at a time with ``rfind``, not a line at a time."""
    pos = start
    while end - pos > limit:
        nl = data.rfind(b"\n", pos, pos + limit + 1)
        if nl < 0:
            return pos
        pos = nl + 1
    return end

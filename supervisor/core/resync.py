"""Pure logic for re-attaching to a running container without losing or repeating a byte.

The engine offers two views of a container's output: a live attach (only what is printed
after it subscribes) and its json-file log (everything, but line by line). Attaching with
the log replayed first leaves a window between the two in which a line reaches neither,
so the supervisor instead attaches live first, pauses the container, reads the log, and
works out where the live stream starts inside it. The engine's log copier only writes
whole lines (and pieces of 16 KiB when a line is longer), so the log holds the live
bytes up to their last newline, or up to the last 16 KiB boundary after it; the rest of
the live bytes are still in the copier's buffer. This module computes that overlap.
"""

from __future__ import annotations

import codecs
import itertools
import re
from collections.abc import Iterator, Sequence

from supervisor.core.container import Segment

#: The engine's log copier buffer: a line longer than this is logged in pieces of this size.
COPIER_CHUNK = 16 * 1024

_SIGNATURE = 64
#: The engine's message time with ``timestamps=1``: RFC 3339, UTC, nine fraction digits.
#: Fixed width, so byte order is time order.
_STAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ")
STAMP_LEN = 31

#: One log message: (stream, time, payload).
Message = tuple[int, bytes, bytes]


def _per_byte_replace(exc: UnicodeError) -> tuple[str, int]:
    assert isinstance(exc, UnicodeDecodeError)
    return "\ufffd" * (exc.end - exc.start), exc.end


codecs.register_error("sandvisor-per-byte-replace", _per_byte_replace)


def engine_log_bytes(data: bytes) -> bytes:
    """``data`` as the engine's json-file log gives it back: every byte that is not part
    of valid UTF-8 becomes U+FFFD (the engine's JSON encoder replaces byte by byte)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "sandvisor-per-byte-replace").encode("utf-8")
    return data


#: A line that the copier cuts into pieces: at least one whole piece without a newline.
_LONG_LINE = re.compile(rb"[^\n]{%d,}" % COPIER_CHUNK)


def _messages_raw(data: bytes) -> Iterator[bytes]:
    """``data`` (starting where a message starts) cut where the copier cuts it into
    messages that are encoded on their own: the 16 KiB pieces of long lines (the piece
    ending a long line keeps its newline), and the stretches between them."""
    if _LONG_LINE.search(data) is None:
        yield data
        return
    pos = 0
    for m in _LONG_LINE.finditer(data):
        yield data[pos : m.start()]
        end = m.end() + (1 if data[m.end() : m.end() + 1] == b"\n" else 0)
        for piece in range(m.start(), end, COPIER_CHUNK):
            yield data[piece : min(piece + COPIER_CHUNK, end)]
        pos = end
    yield data[pos:]


def log_length(data: bytes) -> int:
    """How many bytes the engine's log gives back for ``data``: complete messages (it starts
    where a message starts and ends with a newline or at a piece boundary). Invalid UTF-8
    comes back byte by byte as U+FFFD, and each 16 KiB piece of a longer line is stored on
    its own, so a character the cut splits comes back as U+FFFD too."""
    return sum(len(engine_log_bytes(part)) for part in _messages_raw(data))


def log_bytes(data: bytes) -> bytes:
    """The bytes the engine's log gives back for ``data`` (as :func:`log_length` counts
    them): each message converted on its own."""
    return b"".join(engine_log_bytes(part) for part in _messages_raw(data))


def split_messages(data: bytes, *, final: bool) -> tuple[bytes, bytes]:
    """``data`` (starting where a message starts) as (its complete messages, the rest):
    the rest is the unfinished line's bytes beyond its last whole piece. ``final``: the
    data ends here, so the unfinished line is a message too (the copier flushes at exit)."""
    if final:
        return data, b""
    cut = data.rfind(b"\n") + 1
    whole = cut + (len(data) - cut) // COPIER_CHUNK * COPIER_CHUNK
    return data[:whole], data[whole:]


def logged_prefix_by_lines(live: bytes, chunk: int = COPIER_CHUNK) -> int | None:
    """How many leading bytes of ``live`` the log holds, known from newlines alone: all of
    them up to the last newline, then whole ``chunk`` pieces of the unfinished line. None
    when ``live`` has no newline (the unfinished line began before it; see
    :func:`overlap`)."""
    last = live.rfind(b"\n")
    if last < 0:
        return None
    unfinished = len(live) - (last + 1)
    return len(live) - unfinished % chunk


def _raw_positions(data: bytes) -> dict[int, int]:
    """Map the log's length of each character-boundary prefix of ``data`` to its raw length."""
    positions = {0: 0}
    i = logged = 0
    while i < len(data):
        lead = data[i]
        size = 1
        if lead >= 0x80:
            size = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4
            try:
                data[i : i + size].decode("utf-8")
            except UnicodeDecodeError:
                size = 0
        if size:
            i += size
            logged += size
        else:
            i += 1
            logged += 3
        positions[logged] = i
    return positions


def overlap(log_tail: bytes, live: bytes) -> int:
    """The largest ``j`` such that the log ends with ``live[:j]`` (as the log stores it).

    Used when ``live`` holds no newline: the log then ends at a piece boundary somewhere
    in the unfinished line, and the only way to tell where is to compare bytes.
    """
    if not live or not log_tail:
        return 0
    encoded = engine_log_bytes(live)
    # Raw prefix lengths by encoded length (they differ only where bytes were replaced).
    raw_at = None if len(encoded) == len(live) else _raw_positions(live)
    best = 0
    limit = min(len(encoded), len(log_tail))
    # Short overlaps: check each length directly.
    for k in range(1, min(limit, _SIGNATURE) + 1):
        if log_tail.endswith(encoded[:k]):
            best = k
    if limit > _SIGNATURE:
        # Longer ones must contain the log's last bytes: find where they occur in the live
        # bytes (a C-speed search), then compare the whole overlap at each candidate.
        signature = log_tail[-_SIGNATURE:]
        start = _SIGNATURE
        while True:
            at = encoded.find(signature, start - _SIGNATURE, limit)
            if at < 0:
                break
            k = at + _SIGNATURE
            if k > best and log_tail.endswith(encoded[:k]):
                best = k
            start = k + 1
    if raw_at is None:
        return best
    while best > 0 and best not in raw_at:
        best -= 1
    return raw_at.get(best, 0)


def split_stamp(kind: int, frame: bytes) -> Message | None:
    """A timestamped log frame as ``(stream, time, payload)``; None if it is not one."""
    if _STAMP.match(frame) is None:
        return None
    return kind, frame[: STAMP_LEN - 1], frame[STAMP_LEN:]


def after_anchor(
    messages: Sequence[Message], anchor: bytes, seen: int, *, whole_log: bool
) -> list[Message] | None:
    """The messages of a log tail that come after an anchor: the time of the last message
    already read and how many messages with that time were read (pieces of one long line
    share their first piece's time). None when the tail does not reach back to the
    anchor (read a longer one) or the times are out of order (do not trust them).

    ``whole_log``: the tail is the whole log, so an anchor older than all of it (rotated
    away) still counts as reached.
    """
    times = [t for _, t, _ in messages]
    if any(a > b for a, b in itertools.pairwise(times)):
        return None
    if not whole_log and (not messages or messages[0][1] >= anchor):
        return None
    out: list[Message] = []
    equal = 0
    for message in messages:
        stamp = message[1]
        if stamp < anchor:
            continue
        if stamp == anchor:
            equal += 1
            if equal <= seen:
                continue
        out.append(message)
    return out


def drop_known(skip: dict[int, int], segments: Sequence[Segment]) -> list[Segment]:
    """``segments`` without the first ``skip[stream]`` bytes of each stream (1 stdout, 2
    stderr), which are already stored; ``skip`` counts down as they pass."""
    out: list[Segment] = []
    for kind, payload in segments:
        key = 2 if kind == 2 else 1
        known = skip[key]
        if known >= len(payload):
            skip[key] = known - len(payload)
            continue
        skip[key] = 0
        out.append((kind, payload[known:]))
    return out


def stream_of(kind: int) -> int:
    """The stream a frame belongs to: 2 stderr, everything else stdout (1)."""
    return 2 if kind == 2 else 1


class Bulk:
    """What a re-attach read from the engine's log before pausing the container: feed it
    the log's stamped messages in order with :meth:`take`."""

    __slots__ = ("anchor", "anchored", "consumed", "seen", "skip", "stopped", "written")

    def __init__(self, skip: dict[int, int]) -> None:
        #: File bytes not yet matched in the log, per stream (counts down while reading).
        self.skip = skip
        #: Log bytes seen, per stream.
        self.consumed = {1: 0, 2: 0}
        #: Log bytes stored in the output file.
        self.written = 0
        #: The last message's time (b"": the log was empty) and how many carried it.
        self.anchor = b""
        self.seen = 0
        #: Whether the rest can be found by time (one stream, every message stamped).
        self.anchored = True
        self.stopped = False

    def take(self, segments: Sequence[Segment]) -> list[Segment]:
        """Account for stamped log messages; return the payloads beyond the file. At a
        message without a time, stop (``stopped``): the rest is read another way."""
        taken: list[Segment] = []
        for kind, frame in segments:
            message = split_stamp(kind, bytes(frame))
            if message is None:
                self.anchored = False
                self.stopped = True
                break
            k, stamp, payload = message
            if k == 2:
                self.anchored = False  # two streams: their times interleave
            if stamp == self.anchor:
                self.seen += 1
            else:
                self.anchor, self.seen = stamp, 1
            self.consumed[k] += len(payload)
            taken.append((k, payload))
        out = drop_known(self.skip, taken)
        self.written += sum(len(p) for _, p in out)
        return out


def live_cut(
    live: dict[int, bytes], tails: dict[int, bytes], *, ended: bool
) -> tuple[dict[int, int], list[int]]:
    """How many bytes at the end of each stream's log the live bytes already hold, and the
    streams where the log's tail does not end as expected (logged as unverified).

    ``live``: the live bytes per stream; ``tails``: the end of each stream's log;
    ``ended``: the container stopped, so the copier flushed everything it held."""
    cut: dict[int, int] = {}
    unverified: list[int] = []
    for k, data in live.items():
        logged = len(data) if ended else logged_prefix_by_lines(data)
        if logged is None:
            logged = overlap(tails[k], data)
        # Each message is converted on its own, so a character one of the copier's 16 KiB
        # cuts splits is logged as U+FFFD per byte. Where the cuts fall is known from a
        # message start: if the live stream began at one, from its start; else from its
        # first newline (the line it began in started earlier: converted as a whole).
        first = data.find(b"\n", 0, logged)
        head = logged if first < 0 else first + 1
        expected = engine_log_bytes(data[:head]) + log_bytes(data[head:logged])
        at_message = log_bytes(data[:logged])
        if not tails[k].endswith(expected) and tails[k].endswith(at_message):
            expected = at_message
        elif not tails[k].endswith(expected):
            unverified.append(k)
        cut[k] = len(expected)
    return cut, unverified

"""LineChunker and TokenBucket: monitor stdout bytes -> ordered, lossless, throttled events."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.core.events import BaseEvent, TaskOutput, TaskOutputSuppressed
from supervisor.core.monitor import LineChunker, TokenBucket
from supervisor.core.policy import Monitor
from tests.conftest import examples

MAX_CHUNK = 1024
PIECE = MAX_CHUNK - 1  # room for the separator


def unlimited(window_ms: int = 200) -> Monitor:
    return Monitor(
        batch_window_ms=window_ms,
        max_chunk_bytes=MAX_CHUNK,
        lines_per_s=1_000_000,
        burst_lines=10_000_000,
    )


def chunker(cfg: Monitor) -> LineChunker:
    return LineChunker(cfg, "s1", "bg-00000001")


@dataclass(frozen=True)
class Seg:
    data: bytes
    eol: bool
    cut: bool


def _boundary(line: bytes, limit: int) -> int:
    """Reference: the largest cut <= limit that starts a UTF-8 character."""
    cut = limit
    while (line[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


def reference_segments(data: bytes) -> list[Seg]:
    """Independent model of what the chunker counts as lines (pieces included)."""
    out: list[Seg] = []
    *lines, final = data.split(b"\n")

    def cut(line: bytes, eol: bool) -> None:
        while len(line) > PIECE:
            c = _boundary(line, PIECE)
            out.append(Seg(line[:c], False, True))
            line = line[c:]
        out.append(Seg(line, eol, False))

    for line in lines:
        cut(line, True)
    if final:
        cut(final, False)
    return out


def outputs(events: list[BaseEvent]) -> list[TaskOutput]:
    return [e for e in events if isinstance(e, TaskOutput)]


def rebuild(events: list[BaseEvent]) -> str:
    return "".join(e.text + ("\n" if e.eol else "") for e in outputs(events))


def check_chunks_against_reference(events: list[BaseEvent], ref: list[Seg]) -> None:
    """Each chunk holds exactly the reference lines its ordinal and line count name."""
    for ev in outputs(events):
        assert ev.session_id == "s1"
        assert ev.task_id == "bg-00000001"
        assert len(ev.text.encode()) <= MAX_CHUNK
        assert "\ufffd" not in ev.text  # no character was split
        parts = ev.text.split("\n")
        assert ev.lines == len(parts) >= 1
        want = ref[ev.ordinal - ev.lines : ev.ordinal]
        assert [p.encode() for p in parts] == [s.data for s in want]
        assert ev.eol == want[-1].eol
        assert ev.cut == want[-1].cut
        # only the chunk's last line may be a cut piece or lack its newline
        assert all(s.eol for s in want[:-1])


def coverage(events: list[BaseEvent]) -> list[int]:
    """Line ordinals in event order: chunk lines and suppressed ranges."""
    seen: list[int] = []
    for ev in events:
        if isinstance(ev, TaskOutput):
            seen.extend(range(ev.ordinal - ev.lines + 1, ev.ordinal + 1))
        elif isinstance(ev, TaskOutputSuppressed):
            assert ev.lines == ev.last_ordinal - ev.first_ordinal + 1 >= 1
            seen.extend(range(ev.first_ordinal, ev.last_ordinal + 1))
    return seen


# -- strategies -------------------------------------------------------------------------

_chars = st.characters(
    exclude_categories=["Cs"], exclude_characters="\ufffd", max_codepoint=0x1F9FF
)
_runs = st.builds(
    lambda c, n: c * n, st.sampled_from(["a", "é", "€", "😀", "x\n"]), st.integers(0, 1400)
)
stdout_text = st.lists(
    st.one_of(st.text(_chars, max_size=30), st.sampled_from(["\n", "\n\n", "tail"]), _runs),
    max_size=12,
).map("".join)


def split_points(draw: st.DrawFn, n: int) -> list[int]:
    cuts = draw(st.lists(st.integers(0, n), max_size=12))
    return [0, *sorted(set(cuts)), n]


@st.composite
def fed_stdout(draw: st.DrawFn) -> tuple[bytes, list[tuple[bytes, float]]]:
    data = draw(stdout_text).encode()
    bounds = split_points(draw, len(data))
    now = 0.0
    pieces: list[tuple[bytes, float]] = []
    for a, b in itertools.pairwise(bounds):
        now += draw(st.sampled_from([0.0, 0.001, 0.05, 0.2, 1.0]))
        pieces.append((data[a:b], now))
    return data, pieces


def run(ch: LineChunker, pieces: list[tuple[bytes, float]]) -> list[BaseEvent]:
    events: list[BaseEvent] = []
    for chunk, now in pieces:
        due = ch.next_flush_at()
        if due is not None and due <= now:
            events += ch.tick(now)
        events += ch.feed(chunk, now)
    events += ch.flush_all()
    return events


# -- properties -------------------------------------------------------------------------


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=fed_stdout(), window_ms=st.sampled_from([0, 50, 200]))
def test_chunks_rebuild_stdout_exactly(
    case: tuple[bytes, list[tuple[bytes, float]]], window_ms: int
) -> None:
    data, pieces = case
    ch = chunker(unlimited(window_ms))
    events = run(ch, pieces)
    assert all(isinstance(e, TaskOutput) for e in events)  # no suppression without a flood
    assert rebuild(events) == data.decode()
    ref = reference_segments(data)
    check_chunks_against_reference(events, ref)
    ords = [e.ordinal for e in outputs(events)]
    assert ords == sorted(set(ords))  # strictly increasing
    assert coverage(events) == list(range(1, len(ref) + 1))
    assert ch.ordinal == len(ref)
    assert ch.flush_all() == []
    assert ch.next_flush_at() is None


@st.composite
def flood(draw: st.DrawFn) -> tuple[bytes, list[tuple[bytes, float]]]:
    n_lines = draw(st.integers(1, 120))
    lines = [f"line {i} " + "z" * draw(st.integers(0, 1200)) for i in range(n_lines)]
    data = ("\n".join(lines) + draw(st.sampled_from(["", "\n"]))).encode()
    bounds = split_points(draw, len(data))
    now = 0.0
    pieces = []
    for a, b in itertools.pairwise(bounds):
        now += draw(st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.5, 2.0]))
        pieces.append((data[a:b], now))
    return data, pieces


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=flood(), rate=st.sampled_from([1.0, 5.0, 50.0]), burst=st.integers(1, 6))
def test_flood_suppression_ranges_cover_exactly_the_missing_lines(
    case: tuple[bytes, list[tuple[bytes, float]]], rate: float, burst: int
) -> None:
    data, pieces = case
    cfg = Monitor(
        batch_window_ms=100, max_chunk_bytes=MAX_CHUNK, lines_per_s=rate, burst_lines=burst
    )
    ch = chunker(cfg)
    events = run(ch, pieces)
    ref = reference_segments(data)
    check_chunks_against_reference(events, ref)
    # every ordinal exactly once, in order: in a chunk or in a suppressed range
    assert coverage(events) == list(range(1, len(ref) + 1))
    suppressed = [e for e in events if isinstance(e, TaskOutputSuppressed)]
    for a, b in itertools.pairwise(suppressed):
        assert a.last_ordinal < b.first_ordinal


def test_a_flood_beyond_the_bucket_is_suppressed_and_summarised() -> None:
    cfg = Monitor(batch_window_ms=0, max_chunk_bytes=MAX_CHUNK, lines_per_s=10, burst_lines=3)
    ch = chunker(cfg)
    events = ch.feed(b"".join(f"l{i}\n".encode() for i in range(1, 11)), 0.0)
    # three lines pass the bucket (one chunk, emitted when the gap opens); the gap is pending
    assert [(e.text, e.ordinal) for e in outputs(events)] == [("l1\nl2\nl3", 3)]
    assert not any(isinstance(e, TaskOutputSuppressed) for e in events)
    due = ch.next_flush_at()
    assert due is not None
    assert ch.tick(due - 0.001) == []
    summary = ch.tick(due)
    assert len(summary) == 1
    sup = summary[0]
    assert isinstance(sup, TaskOutputSuppressed)
    assert (sup.first_ordinal, sup.last_ordinal, sup.lines) == (4, 10, 7)
    # one second later the bucket has refilled: lines pass again with the next ordinal
    later = ch.feed(b"l11\n", 1.0)
    assert [(e.text, e.ordinal) for e in outputs(later)] == [("l11", 11)]


def test_suppression_summary_comes_before_the_next_passing_line() -> None:
    cfg = Monitor(batch_window_ms=0, max_chunk_bytes=MAX_CHUNK, lines_per_s=1, burst_lines=1)
    ch = chunker(cfg)
    events = ch.feed(b"a\nb\nc\n", 0.0)
    events += ch.feed(b"d\n", 5.0)
    assert [type(e).__name__ for e in events] == [
        "TaskOutput",
        "TaskOutputSuppressed",
        "TaskOutput",
    ]
    assert coverage(events) == [1, 2, 3, 4]


def test_flush_all_delivers_pending_suppression_and_final_line() -> None:
    cfg = Monitor(batch_window_ms=0, max_chunk_bytes=MAX_CHUNK, lines_per_s=1, burst_lines=1)
    ch = chunker(cfg)
    events = ch.feed(b"a\nb\nc\nno newline", 0.0)
    events += ch.flush_all()
    assert coverage(events) == [1, 2, 3, 4]
    last = events[-1]
    assert isinstance(last, TaskOutput)
    assert (last.text, last.eol, last.cut, last.ordinal) == ("no newline", False, False, 4)


# -- throttle ---------------------------------------------------------------------------


def test_leading_edge_then_window_batching() -> None:
    ch = chunker(unlimited(200))
    first = ch.feed(b"one\n", 10.0)
    assert [(e.text, e.ordinal) for e in outputs(first)] == [("one", 1)]  # at once
    assert ch.next_flush_at() is None
    assert ch.feed(b"two\n", 10.05) == []
    assert ch.feed(b"three\n", 10.1) == []
    assert ch.next_flush_at() == pytest.approx(10.2)
    assert ch.tick(10.15) == []
    out = ch.tick(10.2)
    assert [(e.text, e.ordinal, e.lines) for e in outputs(out)] == [("two\nthree", 3, 2)]
    assert ch.next_flush_at() is None
    # still inside the window of the last emission: held until its end
    assert ch.feed(b"four\n", 10.3) == []
    assert ch.next_flush_at() == pytest.approx(10.4)
    assert [e.text for e in outputs(ch.tick(10.4))] == ["four"]
    # a quiet window has passed: the next line goes out at once again
    assert [e.text for e in outputs(ch.feed(b"five\n", 11.0))] == ["five"]


def test_feed_after_the_window_emits_the_held_batch_with_the_new_line() -> None:
    ch = chunker(unlimited(200))
    ch.feed(b"a\n", 0.0)
    assert ch.feed(b"b\n", 0.1) == []
    out = ch.feed(b"c\n", 0.25)  # nobody ticked; the feed itself notices the window passed
    assert [(e.text, e.ordinal) for e in outputs(out)] == [("b\nc", 3)]


def test_zero_window_emits_every_feed_at_once() -> None:
    ch = chunker(unlimited(0))
    assert [e.text for e in outputs(ch.feed(b"a\n", 0.0))] == ["a"]
    assert [e.text for e in outputs(ch.feed(b"b\nc\n", 0.0))] == ["b\nc"]


# -- lines and pieces -------------------------------------------------------------------


def test_partial_line_is_held_until_its_newline() -> None:
    ch = chunker(unlimited(0))
    assert ch.feed(b"hel", 0.0) == []
    assert ch.feed(b"lo", 0.0) == []
    out = outputs(ch.feed(b" world\nnext", 0.0))
    assert [(e.text, e.eol, e.ordinal) for e in out] == [("hello world", True, 1)]
    final = outputs(ch.flush_all())
    assert [(e.text, e.eol, e.cut, e.ordinal) for e in final] == [("next", False, False, 2)]


def test_multibyte_character_split_across_feeds_is_kept_whole() -> None:
    data = "h€llo 😀\n".encode()
    ch = chunker(unlimited(0))
    events: list[BaseEvent] = []
    for i in range(len(data)):
        events += ch.feed(data[i : i + 1], 0.0)
    assert [e.text for e in outputs(events)] == ["h€llo 😀"]


def test_over_long_line_is_cut_at_character_boundaries() -> None:
    line = "😀" * 700  # 2800 bytes; 1023 is not a multiple of 4
    ch = chunker(unlimited(0))
    events = ch.feed(line.encode() + b"\n", 0.0)
    got = [(len(e.text), e.cut, e.eol, e.ordinal, e.lines) for e in outputs(events)]
    # 1020 bytes = 255 emoji per piece; the rest ends the line
    assert got == [(255, True, False, 1, 1), (255, True, False, 2, 1), (190, False, True, 3, 1)]
    assert rebuild(events) == line + "\n"


def test_endless_line_is_emitted_piece_by_piece_while_it_grows() -> None:
    ch = chunker(unlimited(0))
    events: list[BaseEvent] = []
    for _ in range(50):
        events += ch.feed(b"x" * 100, 0.0)
    # 5000 bytes: four full pieces are out, the last 908 bytes wait for more
    assert [(len(e.text), e.cut) for e in outputs(events)] == [(PIECE, True)] * 4
    events += ch.flush_all()
    assert rebuild(events) == "x" * 5000
    assert outputs(events)[-1].cut is False
    assert outputs(events)[-1].eol is False


def test_many_lines_in_one_window_are_split_at_max_chunk_bytes() -> None:
    ch = chunker(unlimited(10_000))
    line = b"y" * 300
    events = ch.feed((line + b"\n") * 10, 0.0)
    # full chunks go out as soon as the next line would not fit; the rest waits
    assert [e.lines for e in outputs(events)] == [3, 3, 3]
    assert ch.next_flush_at() == pytest.approx(10.0)
    events += ch.flush_all()
    assert rebuild(events) == ("y" * 300 + "\n") * 10
    assert all(len(e.text.encode()) <= MAX_CHUNK for e in outputs(events))
    assert [(e.lines, e.ordinal) for e in outputs(events)] == [(3, 3), (3, 6), (3, 9), (1, 10)]


def test_resume_continues_ordinals() -> None:
    ch = chunker(unlimited(0))
    ch.resume(ordinal=41, offset=1000, floor=41)
    assert [e.ordinal for e in outputs(ch.feed(b"a\nb\n", 0.0))] == [43]
    assert ch.consumed == 1004


def test_resume_replays_without_repeating_delivered_lines() -> None:
    """After a crash the last checkpoint is older than the last delivered event: the lines
    in between are fed again, and only the ones never delivered come out."""
    data = b"".join(f"l{i}\n".encode() for i in range(1, 11))
    first = chunker(unlimited(0))
    delivered = outputs(first.feed(data[:12], 0.0))  # l1..l4 counted and delivered
    assert delivered[-1].ordinal == 4
    checkpoint = (2, len(b"l1\nl2\n"))  # an older checkpoint: 2 lines, 6 bytes
    again = chunker(unlimited(0))
    again.resume(ordinal=checkpoint[0], offset=checkpoint[1], floor=4)
    events = outputs(again.feed(data[checkpoint[1] :], 1.0)) + outputs(again.flush_all())
    lines = [line for e in events for line in e.text.split("\n")]
    assert lines == [f"l{i}" for i in range(5, 11)]
    assert events[0].ordinal - events[0].lines + 1 == 5
    assert events[-1].ordinal == 10


def test_empty_lines_count() -> None:
    ch = chunker(unlimited(0))
    events = ch.feed(b"\n\n\n", 0.0)
    assert [(e.text, e.lines, e.ordinal) for e in outputs(events)] == [("\n\n", 3, 3)]
    assert rebuild(events) == "\n\n\n"


def test_nothing_fed_flushes_nothing() -> None:
    ch = chunker(unlimited())
    assert ch.flush_all() == []
    assert ch.tick(100.0) == []
    assert ch.next_flush_at() is None


# -- token bucket -----------------------------------------------------------------------


def test_token_bucket_burst_then_refill() -> None:
    b = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(0.4) is False  # 0.8 tokens
    assert b.take(0.5) is True  # 1.0 token
    assert b.take(0.5) is False
    # refill never exceeds the burst
    assert [b.take(100.0) for _ in range(4)] == [True, True, True, False]


def test_token_bucket_ignores_time_going_backwards() -> None:
    b = TokenBucket(rate=1.0, burst=1, now=10.0)
    assert b.take(10.0) is True
    assert b.take(5.0) is False
    assert b.take(10.5) is False
    assert b.take(11.0) is True


def test_a_few_huge_lines_are_a_flood_too() -> None:
    """The byte budget: 4 pieces of 256 KiB exhaust a 512 KiB burst; the rest is suppressed
    (and still counted by ordinal), so event text stays bounded whatever the line length."""
    cfg = Monitor(
        batch_window_ms=0,
        lines_per_s=1e6,
        burst_lines=1_000_000,
        bytes_per_s=1024,
        burst_bytes=512 * 1024,
    )
    ch = LineChunker(cfg, "s", "t")
    events = ch.feed(b"x" * (4 * 1024 * 1024) + b"\n", 0.0) + ch.flush_all()
    text = sum(len(e.text) for e in events if isinstance(e, TaskOutput))
    assert text <= 512 * 1024
    suppressed = [e for e in events if isinstance(e, TaskOutputSuppressed)]
    assert suppressed
    assert suppressed[-1].last_ordinal == ch.ordinal


# -- floods -----------------------------------------------------------------------------


def contiguous(events: list[BaseEvent]) -> int:
    """``coverage`` without the list of millions: ranges follow each other; the last ordinal."""
    last = 0
    for ev in events:
        if isinstance(ev, TaskOutput):
            first, last_here = ev.ordinal - ev.lines + 1, ev.ordinal
        elif isinstance(ev, TaskOutputSuppressed):
            first, last_here = ev.first_ordinal, ev.last_ordinal
        else:
            continue
        assert first == last + 1
        last = last_here
    return last


def drive(
    ch: LineChunker, feeds: list[tuple[float, bytes]], end: float
) -> list[tuple[float, BaseEvent]]:
    """Like the runner: a timer calls ``tick`` at every ``next_flush_at``, reads call ``feed``;
    each event with the (fake) time it went out. ``flush_all`` events are stamped ``inf``."""
    out: list[tuple[float, BaseEvent]] = []
    for now, data in [*feeds, (end, b"")]:
        while (due := ch.next_flush_at()) is not None and due <= now:
            out += [(due, e) for e in ch.tick(due)]
        out += [(now, e) for e in ch.feed(data, now)]
    out += [(float("inf"), e) for e in ch.flush_all()]
    return out


def test_a_yes_flood_costs_one_small_event_per_window() -> None:
    """Issue 14, defect 9: a ``yes`` monitor gave 980 task.output events alternating with 979
    task.output_suppressed, 1-8 ms apart (4.6 MB of notifications in 20 s): every read let
    one refilled token through, which closed the notice and opened a one-line chunk."""
    cfg = Monitor()  # the default policy's settings: 200 ms window, 200 lines/s
    ch = LineChunker(cfg, "s1", "bg-00000001")
    feeds = []
    now = 0.0
    for i in itertools.count():
        now += (1 + i % 8) / 1000  # reads 1-8 ms apart, as seen
        if now >= 20.0:
            break
        feeds.append((now, b"y\n" * 512))
    timed = drive(ch, feeds, 20.0)
    events = [e for _, e in timed]
    lines = sum(len(d) for _, d in feeds) // 2
    assert contiguous(events) == lines  # every line: sent or counted
    windows = 20.0 / cfg.batch_window_ms * 1000
    assert len(events) <= windows + 3  # one per window (and the final flush)
    notices = [t for t, e in timed if isinstance(e, TaskOutputSuppressed)]
    assert len(notices) <= windows / 2 + 2
    live = [t for t, _ in timed if t != float("inf")]
    gaps = [b - a for a, b in itertools.pairwise(live)]
    assert min(gaps) >= cfg.batch_window_ms / 1000 - 1e-9
    assert sum(len(e.model_dump_json()) for e in events) < 64 * 1024
    # still a useful sample: some lines of output in every second of the flood
    seconds = {int(t) for t, e in timed if isinstance(e, TaskOutput) and t < 20}
    assert seconds == set(range(20))


def test_a_flood_with_zero_window_is_paced_at_50_ms() -> None:
    cfg = Monitor(batch_window_ms=0, lines_per_s=100, burst_lines=10)
    ch = chunker(cfg)
    feeds = [(i / 1000, b"line\n" * 20) for i in range(1, 2000)]
    timed = drive(ch, feeds, 2.0)
    live = [t for t, _ in timed if t != float("inf")]
    assert min(b - a for a, b in itertools.pairwise(live)) >= 0.05 - 1e-9
    assert len(live) <= 2.0 / 0.05 + 2
    assert coverage([e for _, e in timed]) == list(range(1, 1999 * 20 + 1))


def test_the_flood_ends_when_a_window_passes_without_suppression() -> None:
    cfg = Monitor(batch_window_ms=100, max_chunk_bytes=MAX_CHUNK, lines_per_s=10, burst_lines=5)
    ch = chunker(cfg)
    timed = drive(ch, [(0.0, b"x\n" * 50)], 0.5)
    assert [type(e).__name__ for _, e in timed] == ["TaskOutput", "TaskOutputSuppressed"]
    # a quiet second later a line goes out at once again, and a full chunk is not held back
    out = ch.feed(b"a\n", 2.0)
    assert [(e.text, e.ordinal) for e in outputs(out)] == [("a", 51)]
    ch2 = chunker(Monitor(batch_window_ms=10_000, max_chunk_bytes=MAX_CHUNK))
    assert [e.lines for e in outputs(ch2.feed((b"y" * 300 + b"\n") * 4, 0.0))] == [3]


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=flood(), rate=st.sampled_from([1.0, 5.0, 50.0]), burst=st.integers(1, 6))
def test_suppression_notices_and_their_neighbours_are_a_window_apart(
    case: tuple[bytes, list[tuple[bytes, float]]], rate: float, burst: int
) -> None:
    data, pieces = case
    cfg = Monitor(
        batch_window_ms=100, max_chunk_bytes=MAX_CHUNK, lines_per_s=rate, burst_lines=burst
    )
    ch = chunker(cfg)
    timed = drive(ch, [(now, chunk) for chunk, now in pieces], pieces[-1][1] + 1.0)
    events = [e for _, e in timed]
    assert coverage(events) == list(range(1, len(reference_segments(data)) + 1))
    check_chunks_against_reference(events, reference_segments(data))
    live = [(t, e) for t, e in timed if t != float("inf")]
    for (t1, e1), (t2, e2) in itertools.pairwise(live):
        if isinstance(e1, TaskOutputSuppressed) or isinstance(e2, TaskOutputSuppressed):
            assert t2 - t1 >= 0.1 - 1e-9

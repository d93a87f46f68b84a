"""LineScanner and compile_pattern: linear-time, chunking-independent first-match line search."""

from __future__ import annotations

import asyncio
import itertools
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.core.errors import SpecError
from supervisor.core.models import PatternMatch
from supervisor.core.scan import (
    DEFAULT_WINDOW,
    MAX_PATTERN_CHARS,
    LineScanner,
    Pattern,
    _clean,
    compile_pattern,
)
from tests.conftest import examples

# -- references ---------------------------------------------------------------------------


def reference(pattern: Pattern, data: bytes, window: int, base: int = 0) -> PatternMatch | None:
    """The documented semantics, one line at a time over the whole output: each line is
    searched whole, or in windows of ``window`` bytes every half window when longer."""
    *lines, final = data.split(b"\n")
    if final:
        lines.append(final)  # the unterminated last line counts once the output ends
    offset = base
    step = window // 2
    for line in lines:
        clean = _clean(line)
        k = 0
        while True:
            lo = k * step
            hi = min(lo + window, len(line))
            if pattern._search(clean, lo, hi) >= 0:
                return PatternMatch(line=line[lo:hi].decode("utf-8", "replace"), offset=offset + lo)
            if hi >= len(line):
                break
            k += 1
        offset += len(line) + 1
    return None


def scan(
    pattern: Pattern, pieces: list[bytes], window: int = DEFAULT_WINDOW, base: int = 0
) -> PatternMatch | None:
    scanner = LineScanner(pattern, base, window=window)
    offset = base
    for piece in pieces:
        found = scanner.feed(piece, offset)
        offset += len(piece)
        if found is not None:
            return found
        assert scanner.held <= window + 8  # one window and its margins, never the line
    return scanner.finish()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted({c % (len(data) + 1) for c in cuts}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# -- properties ---------------------------------------------------------------------------

PATTERNS = [
    r"ab",
    r"^a",
    r"b$",
    r"^$",
    r"a+b",
    r"\bab\b",
    r"é",
    r"(?i)AB",
    r"[^a]b",
    r"\s",
    r"b.b",
    r"\Aa",
    r"b\Z",
    r"(?-m:^b)",
    r"(?i-m)^B",
    r"a{3}",
    r"^a{,2}b",
    r"\?",
    r"x",
    r"",
    r"(a+)+$",
    r"[é€]b",
    r"^.{5}$",
    r"\Q.b\E",
    r"[]a]b",
    r"[[:space:]]a",
]
_tokens = st.sampled_from(
    [b"a", b"b", b"ab", b"\n", b" ", b".", "é".encode(), "€".encode(), b"\xff", b"\xc3", b"?"]
)
_runs = st.builds(
    lambda t, n: t * n, st.sampled_from([b"a", b"ab", "é".encode()]), st.integers(1, 60)
)
output = st.lists(st.one_of(_tokens, _runs), max_size=40).map(b"".join)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=output,
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    pattern=st.sampled_from(PATTERNS),
    window=st.sampled_from([16, 18, 32, DEFAULT_WINDOW]),
    base=st.sampled_from([0, 7]),
)
def test_any_chunking_finds_the_reference_match(
    data: bytes, cuts: list[int], pattern: str, window: int, base: int
) -> None:
    compiled = compile_pattern(pattern)
    want = reference(compiled, data, window, base)
    assert scan(compiled, split(data, cuts), window, base) == want
    assert scan(compiled, [data[i : i + 1] for i in range(len(data))], window, base) == want


# Python's bytes patterns where RE2 means the same (ASCII text and patterns).
PYTHON_SAME = [p for p in PATTERNS if p.isascii() and "\\Q" not in p and "[[:" not in p]
ascii_output = st.lists(
    st.sampled_from([b"a", b"b", b"ab", b"\n", b" ", b".", b"?", b"aaaa", b"x"]), max_size=40
).map(b"".join)


@settings(max_examples=examples(300), deadline=None)
@given(
    data=ascii_output,
    cuts=st.lists(st.integers(0, 1000), max_size=6),
    pattern=st.sampled_from(PYTHON_SAME),
)
def test_short_lines_match_like_python_re_per_line(
    data: bytes, cuts: list[int], pattern: str
) -> None:
    python = re.compile(pattern.replace(r"(?i-m)", "(?i)").encode())
    want = None
    offset = 0
    *lines, final = data.split(b"\n")
    for line in [*lines, final] if final else lines:
        if python.search(line):
            want = PatternMatch(line=line.decode(), offset=offset)
            break
        offset += len(line) + 1
    assert scan(compile_pattern(pattern), split(data, cuts)) == want


# -- lines --------------------------------------------------------------------------------


def test_first_matching_line_and_its_offset() -> None:
    pattern = compile_pattern(r"^listening on :\d+$")
    data = b"starting\nlistening on :abc\nlistening on :8080\nlistening on :9090\n"
    found = scan(pattern, [data[:20], data[20:40], data[40:]], base=100)
    assert found == PatternMatch(
        line="listening on :8080", offset=100 + data.index(b"listening on :8")
    )


def test_an_unterminated_line_counts_only_at_the_end() -> None:
    scanner = LineScanner(compile_pattern("ready"), 0)
    assert scanner.feed(b"booting\nready", 0) is None  # the line may still grow
    assert scanner.finish() == PatternMatch(line="ready", offset=8)


def test_empty_final_line_is_not_a_line() -> None:
    scanner = LineScanner(compile_pattern("^$"), 0)
    assert scanner.feed(b"a\nb\n", 0) is None
    assert scanner.finish() is None
    assert scan(compile_pattern("^$"), [b"a\n\nb\n"]) == PatternMatch(line="", offset=2)


def test_a_match_never_spans_lines() -> None:
    for pattern in [r"a\nb", r"a\sb", r"a[^x]b", r"(?s)a.b", r"a\Wb", r"a\D*b"]:
        assert scan(compile_pattern(pattern), [b"xa\nb\n"]) is None, pattern


def test_invalid_utf8_bytes_count_as_question_marks() -> None:
    data = b"caf\xe9 x\n"
    found = scan(compile_pattern(r"^caf. x$"), [data[:4], data[4:]])
    assert found == PatternMatch(line="caf\ufffd x", offset=0)
    # a character split between feeds stays one character
    euro = "€".encode()
    assert scan(compile_pattern(r"^.$"), [euro[:1], euro[1:2], euro[2:] + b"\n"]) == PatternMatch(
        line="€", offset=0
    )


def test_after_a_match_the_scanner_keeps_its_answer() -> None:
    scanner = LineScanner(compile_pattern("b"), 0)
    first = scanner.feed(b"a\nb\nb\n", 0)
    assert first == PatternMatch(line="b", offset=2)
    assert scanner.feed(b"b\n", 6) == first
    assert scanner.finish() == first
    assert scanner.match == first


def test_feeds_must_be_contiguous() -> None:
    scanner = LineScanner(compile_pattern("x"), 10)
    assert scanner.position == 10
    with pytest.raises(ValueError, match="expected 10"):
        scanner.feed(b"abc", 0)
    scanner.feed(b"abc", 10)
    assert scanner.position == 13
    scanner.finish()
    with pytest.raises(ValueError, match="after finish"):
        scanner.feed(b"", 13)


# -- over-long lines ----------------------------------------------------------------------


def test_an_endless_line_is_searched_in_windows_with_bounded_memory() -> None:
    window = 1 << 16
    pattern = compile_pattern("READY")
    head = b"a" * (5 * window + 123)
    scanner = LineScanner(pattern, 0, window=window)
    offset = 0
    for piece in split(head, list(range(0, len(head), 10_000))):
        assert scanner.feed(piece, offset) is None
        offset += len(piece)
        assert scanner.held <= window + 8
    found = scanner.feed(b"READY" + b"a" * window, offset)
    assert found is not None
    assert "READY" in found.line
    assert len(found.line) == window  # the window that matched, not the whole line
    assert found.offset % (window // 2) == 0
    assert found.offset <= len(head) < found.offset + window - 5


def test_line_anchors_hold_at_the_true_ends_of_a_long_line() -> None:
    window = 32
    line = b"start" + b"x" * 100 + b"end"
    for pattern, where in [(r"^start", 0), (r"end$", 80), (r"^x", None), (r"x$", None)]:
        found = scan(compile_pattern(pattern), [line[:50], line[50:]], window)
        assert (found and found.offset) == where, pattern
    # and the same for the line in the middle of one chunk
    data = b"a\n" + line + b"\nb\n"
    assert scan(compile_pattern(r"end$"), [data], window) == PatternMatch(
        line=line[80:].decode(), offset=2 + 80
    )


def test_a_match_longer_than_half_a_window_may_be_missed_in_a_long_line() -> None:
    """The documented price of bounded memory: windows of 32 bytes every 16 bytes find any
    match up to 16 bytes; this one is 30 bytes and straddles every window."""
    line = b"x" * 10 + b"<" + b"y" * 28 + b">" + b"x" * 30
    pattern = compile_pattern(r"<y+>")
    assert pattern.matches(line)
    assert scan(pattern, [line + b"\n"], window=32) is None
    assert scan(pattern, [line + b"\n"]) == PatternMatch(line=line.decode(), offset=0)


# -- speed --------------------------------------------------------------------------------


def test_catastrophic_pattern_is_linear() -> None:
    """Issue 14, defect 1: ``re.search`` takes seconds on 27 a's and doubles per extra a."""
    pattern = compile_pattern(r"(a+)+$")
    line = b"a" * 100_000 + b"!\n"
    started = time.perf_counter()
    assert scan(pattern, [line] * 20) is None
    assert pattern.matches("a" * 27 + "!") is False
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(
    "chunk",
    [
        pytest.param(
            (b"2024-01-01 INFO request handled in 12ms path=/api/items\n" * 150_000), id="lines"
        ),
        pytest.param(b"a" * (8 << 20), id="one-line"),
    ],
)
def test_scanning_64_mb_takes_well_under_a_few_seconds(chunk: bytes) -> None:
    """Issue 14, defect 2: a 300 MB line took 25 s and 1.5 GB (the carry was re-searched)."""
    pattern = compile_pattern(r"(a+)+$|server ready")
    scanner = LineScanner(pattern, 0)
    started = time.perf_counter()
    offset = 0
    while offset < 64 << 20:
        assert scanner.feed(chunk, offset) is None
        offset += len(chunk)
        assert scanner.held <= DEFAULT_WINDOW + 8
    assert time.perf_counter() - started < 5.0


async def test_a_worker_thread_scanning_leaves_the_event_loop_free() -> None:
    """RE2 releases the GIL while it searches, and big feeds are handled in 1 MiB slices, so
    the loop keeps turning (here under a catastrophic pattern and non-ASCII text)."""
    pattern = compile_pattern(r"(a+)+$")
    chunks = [("h€llo wörld ✓ " * 10 + "\n").encode() * 5_000, b"a" * (8 << 20)]
    loop = asyncio.get_running_loop()
    for chunk in chunks:
        scanner = LineScanner(pattern, 0)

        def work(scanner: LineScanner = scanner, chunk: bytes = chunk) -> None:
            for i in range(4):
                scanner.feed(chunk, i * len(chunk))

        job = loop.run_in_executor(None, work)
        lag = 0.0
        while not job.done():
            before = loop.time()
            await asyncio.sleep(0.001)
            lag = max(lag, loop.time() - before)
        await job
        assert lag < 0.25  # typically a few ms; generous for a loaded 2-core machine


# -- compiling ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "backreferences are not supported"),
        (r"(?P<n>a)(?P=n)", "backreferences are not supported"),
        (r"foo(?=bar)", "lookahead and lookbehind"),
        (r"(?<!x)y", "lookahead and lookbehind"),
        (r"(?>a)", "atomic groups"),
        (r"a++", "possessive quantifiers"),
        (r"(a)?(?(1)b|c)", "conditionals"),
        (r"a(?#note)", "comments"),
        (r"(?x) a b", "only the flags i, m, s and U"),
        (r"\C", r"\C (any single byte)"),
        (r"a{1001}", "limited to 1000"),
        (r"\p{L}{900}", "too large"),
        (r"[", "not a valid regular expression (missing ]"),
        ("a\ud800", "lone surrogate"),
        ("a" * (MAX_PATTERN_CHARS + 1), f"longer than {MAX_PATTERN_CHARS}"),
    ],
)
def test_refused_patterns_name_the_field_and_the_reason(pattern: str, why: str) -> None:
    with pytest.raises(SpecError) as info:
        compile_pattern(pattern)
    message = str(info.value)
    assert message.startswith("pattern: ")
    assert why in message


def test_everyday_python_patterns_compile_and_match() -> None:
    cases = {
        r"^ready$": "ready",
        r"listening on :\d+": "listening on :8080",
        r"(?i)error": "ERROR: boom",
        r"[A-Z][a-z]+ \w+": "Compiled successfully",
        r"(?P<port>\d{2,5})/tcp": "8080/tcp",
        r"\bok\b": "all ok.",
        r"✓ Compiled": "✓ Compiled in 1.2s",
        r"\d+ passed(, \d+ failed)?$": "12 passed, 1 failed",
        r"^\s*$": "   ",
        r"(?i)É": "café",
    }
    for pattern, line in cases.items():
        compiled = compile_pattern(pattern)
        assert compiled.matches(line), pattern
        assert compiled.pattern == pattern
        assert repr(compiled) == f"Pattern({pattern!r})"


def test_matches_takes_str_or_bytes_lines() -> None:
    pattern = compile_pattern(r"^x.y$")
    assert pattern.matches("x€y")
    assert pattern.matches(b"x\xffy")  # an invalid byte counts as '?'
    assert pattern.matches("x\ud800y")  # so does a lone surrogate
    assert not pattern.matches("x€€y")
    assert compile_pattern("b$").matches("a\nb\nc")  # several lines: any of them


# -- issue 25: a line matches as a terminal shows it too ---------------------------------


@pytest.mark.parametrize(
    ("data", "pattern", "offset"),
    [
        (b"a\n\x1b[32mok\x1b[0m\nb\n", "^ok$", 2),
        (b"\x1b[32mok\x1b[0m\n", "^ok$", 0),
        (b"x\n10%\r55%\r100%\n", "^100%$", 2),
        (b"x\nready\r\n", "^ready$", 2),
        (b"x\nok\n\x1b[1mok\x1b[0m\n", "^ok$", 2),  # the earlier plain line comes first
        (b"\x1b[1mfirst\x1b[0m ok\nplain ok\n", "^first ok$", 0),
    ],
)
def test_a_line_matches_as_rendered(data: bytes, pattern: str, offset: int) -> None:
    for split in range(len(data) + 1):
        scanner = LineScanner(compile_pattern(pattern))
        found = scanner.feed(data[:split], 0) or scanner.feed(data[split:], split)
        found = found or scanner.finish()
        assert found is not None, split
        assert found.offset == offset, split
        # The line reported is the raw one, so offsets after it stay the file's.
        line_end = data.index(b"\n", offset)
        assert found.line == data[offset:line_end].decode(), split


def test_a_rendered_line_that_does_not_match_is_not_reported() -> None:
    scanner = LineScanner(compile_pattern("^10%$"))
    assert scanner.feed(b"10%\r100%\n\x1b[1mstill\x1b[0m\n", 0) is None

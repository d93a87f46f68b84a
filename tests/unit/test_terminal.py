"""The terminal renderer (issue 25): what the agent reads instead of escape bytes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from supervisor.core.terminal import (
    MAX_SEQUENCE,
    TerminalRenderer,
    render,
    render_head,
    render_tail,
    render_text,
)

CORPUS = Path(__file__).parents[1] / "data" / "terminal"
ITEMS = sorted(p.stem for p in CORPUS.glob("*.raw"))
#: Items that are mostly a progress display: their rendering must be at least 5x smaller.
PROGRESS = ("buildkit-redraw", "curl-progress", "npm-install", "pip-progress", "tqdm-loop")


def text(data: bytes) -> str:
    return render(data).text


# -- what is removed, what is applied ----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (b"\x1b[1mtest_api\x1b[0m ... \x1b[32mok\x1b[0m (37 ms)\n", "test_api ... ok (37 ms)\n"),
        (b"\x1b[1;38;5;208mbold\x1b[m \x1b[38;2;1;2;3mrgb\x1b[0m", "bold rgb"),
        (b"\x1b]0;window title\x07titled", "titled"),
        (b"\x1b]8;;https://example.com\x1b\\the link\x1b]8;;\x1b\\ after", "the link after"),
        (b"\x1bP1$r0m\x1b\\dcs gone", "dcs gone"),
        (b"10%\r50%\r100% done\n", "100% done\n"),
        (b"abcdef\rXY", "XYcdef"),
        (b"ab\bX", "aX"),
        (b"\x08\x08start", "start"),
        (b"line one\r\nline two\r\n", "line one\nline two\n"),
        (b"downloading\x1b[K\rdone\x1b[K\n", "done\n"),
        (b"abcdef\x1b[3D\x1b[K!", "abc!"),
        (b"abc\x1b[1G\x1b[2Kxyz", "xyz"),
        (b"a\nb\nc\n\x1b[3A\x1b[2KA\n\x1b[2KB\n\x1b[2KC\n", "A\nB\nC\n"),
        (b"one\ntwo\x1b[1F\x1b[Kuno\x1b[1E", "uno\ntwo"),
        (b"keep\x1b[2Jnew", "keep\n    new"),
        (b"keep\n\x1b[H\x1b[2Jnew", "keep\nnew"),
        (b"\x1b7first\x1b8X", "Xirst"),
        (b"abcdef\x1b[2G\x1b[2P", "adef"),
        (b"\x1b[?25l\x1b[?1049hhidden cursor\x1b[?25h", "hidden cursor"),
        (b"tab\tstays", "tab\tstays"),
    ],
)
def test_renders_like_a_terminal(raw: bytes, shown: str) -> None:
    assert text(raw) == shown


def test_other_controls_and_bad_utf8_are_shown_as_everywhere_else() -> None:
    # BEL, NUL, DEL: visible escapes; undecodable bytes: U+FFFD exactly as "replace" decodes.
    raw = b"\x00nul \x07bel \x7f del \xff\xfe bad \xc3\x28 \xe2\x82x \xe2\x80\xae rlo"
    assert text(raw) == "\\x00nul \\x07bel \\x7f del \ufffd\ufffd bad \ufffd( \ufffdx \\u202e rlo"
    assert text(b"\xc2\x9b31m") == "\\x9b31m"  # an 8-bit CSI is not interpreted: shown


def test_broken_sequences_are_shown_not_swallowed() -> None:
    assert text(b"a\x1b\nb") == "a\\x1b\nb"
    # An OSC is never longer than its line: a title left open does not eat the output.
    assert text(b"\x1b]0;open title\nnext line\n") == "\\x1b]0;open title\nnext line\n"
    assert text(b"end \x1b[12") == "end \\x1b[12"  # final: what was there is shown


def test_runs_of_identical_lines_collapse_with_a_count() -> None:
    assert text(b"y\n" * 120) == "y\n[… repeated 120 times]\n"
    assert text(b"a\n" + b"same line\n" * 5 + b"b\n") == "a\nsame line\n[… repeated 5 times]\nb\n"
    assert text(b"x\nx\nend") == "x\nx\nend"  # two are kept
    assert text(b"\n\n\n\nend") == "\n\n\n\nend"  # the count would be longer than the lines


def test_render_text_is_idempotent() -> None:
    for name in ITEMS:
        once = render((CORPUS / f"{name}.raw").read_bytes()).text
        assert render_text(once) == once, name
    raw = "\x1b[31mred alert, red alert\x1b[0m\r\n" * 4 + "z\n"
    assert render_text(raw) == "red alert, red alert\n[… repeated 4 times]\nz\n"


def test_a_status_row_below_the_scroll_region_is_not_part_of_the_log() -> None:
    raw = (
        b"start\n\n\x1b7\x1b[0;29r\x1b8\x1b[1A"
        b"\x1b7\x1b[30;0fProgress: [ 20%]\x1b8Unpacking\r\n"
        b"\x1b7\x1b[30;0fProgress: [ 60%]\x1b8Setting up\r\n"
        b"\x1b7\x1b[30;0fProgress: [ 80%]\x1b8\r\n"
    )
    assert text(raw) == "start\nUnpacking\nSetting up\n\n\nProgress: [ 80%]"
    done = raw + b"\x1b7\x1b[0;30r\x1b8\x1b[1A\x1b[J"
    assert text(done) == "start\nUnpacking\nSetting up\n"


# -- offsets: incomplete sequences are carried, never hidden -------------------------------

SEQUENCES = [
    b"\x1b[38;5;208m",
    b"\x1b]8;;https://example.com/x\x1b\\",
    b"\x1b]0;title\x07",
    b"\x1b[2K",
    b"\x1b7",
    b"\xe2\x96\x88",  # a 3-byte character
]


@pytest.mark.parametrize("seq", SEQUENCES, ids=repr)
def test_a_split_inside_a_sequence_is_carried(seq: bytes) -> None:
    data = b"before " + seq + b"after\n"
    start = len(b"before ")
    whole = render(data).text
    for cut in range(len(data) + 1):
        piece = render(data[:cut], final=False)
        inside = start < cut < start + len(seq)
        assert piece.end == (start if inside else cut), cut
        assert "\\x1b" not in piece.text and "\ufffd" not in piece.text, (cut, piece.text)
        # The next read starts at ``end``: nothing is lost, nothing is shown twice.
        rest = render(data[piece.end :]).text
        if not inside:
            assert set((piece.text + rest).split()) >= set(whole.split()), cut
        # Streaming: every split gives exactly the unsplit rendering.
        r = TerminalRenderer()
        got = r.feed(data[:cut])
        assert r.consumed == piece.end and r.carry == data[piece.end : cut]
        got += r.feed(data[cut:]) + r.finish()
        assert got == whole, cut


def test_streaming_equals_one_shot_for_every_corpus_item_in_small_chunks() -> None:
    for name in ITEMS:
        raw = (CORPUS / f"{name}.raw").read_bytes()
        for size in (1, 7, 4096):
            r = TerminalRenderer()
            out = "".join(r.feed(raw[i : i + size]) for i in range(0, len(raw), size))
            assert out + r.finish() == render(raw).text, (name, size)


def test_a_sequence_too_long_to_carry_is_not_held() -> None:
    data = b"x\x1b]0;" + b"t" * (MAX_SEQUENCE + 10)
    assert render(data, final=False).end == len(data)


def test_head_and_tail_cut_at_line_starts_with_offsets() -> None:
    data = b"".join(b"line %03d \x1b[32mok\x1b[0m\n" % i for i in range(200))
    head = render_head(data, 100)
    assert head.text == render(data[: head.end]).text
    assert head.text.endswith("\n") and len(head.text) <= 100
    assert data[head.end - 1 : head.end] == b"\n"
    tail = render_tail(data, 100, floor=head.end)
    assert tail.text == render(data[tail.start :]).text and len(tail.text) <= 100
    assert tail.text.endswith("line 199 ok\n") and data[tail.start - 1] == ord("\n")
    # A window that does not start at the output's start skips its partial first line.
    window = data[5:]
    assert render_tail(window, 10**6, whole=False).text.startswith("line 001 ok")


def test_a_tail_of_one_endless_progress_line_shows_its_last_frame() -> None:
    data = b"".join(b"\r%3d%% [%s]" % (i, b"#" * (i // 5)) for i in range(101))
    tail = render_tail(data[1000:], 200, whole=False)
    assert tail.text == "100% [" + "#" * 20 + "]"


# -- the corpus: real tools, captured by scripts/capture-terminal.sh --------------------------

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[78]")


def final_screen_words(raw: bytes) -> set[str]:
    """An independent, simple reference: the frame after the last cursor-up (the whole
    output if none), each line as the text after its last carriage return unless erased
    after it, escapes cut."""
    frame = re.split(rb"\x1b\[\d*A", raw)[-1]
    # Drawn between save and restore cursor: a status row (apt's), erased at the end.
    frame = re.sub(rb"\x1b7.*?\x1b8", b"", frame, flags=re.S)
    words: set[str] = set()
    for line in frame.split(b"\n"):
        parts = line.split(b"\r")
        shown = [i for i, p in enumerate(parts) if _ANSI.sub(b"", p).strip()]
        if not shown:
            continue
        later = b"".join(parts[shown[-1] + 1 :])
        if re.search(rb"\x1b\[[02]?K", later):
            continue  # written, then erased
        words.update(_ANSI.sub(b"", parts[shown[-1]]).decode("utf-8", "replace").split())
    return words


@pytest.mark.parametrize("name", ITEMS)
def test_corpus_golden(name: str) -> None:
    raw = (CORPUS / f"{name}.raw").read_bytes()
    golden = (CORPUS / f"{name}.golden").read_text(encoding="utf-8")
    got = render(raw).text
    assert got == golden
    missing = {w for w in final_screen_words(raw) if w not in got}
    assert not missing, (name, sorted(missing)[:20])
    assert "\\x1b" not in got


def test_corpus_has_every_tool() -> None:
    assert set(PROGRESS) | {"apt-install", "pip-plain", "pytest-color"} <= set(ITEMS)


@pytest.mark.parametrize("name", PROGRESS)
def test_progress_outputs_shrink_at_least_5x(name: str) -> None:
    raw = (CORPUS / f"{name}.raw").read_bytes()
    before = len(raw.decode("utf-8", "replace"))
    after = len(render(raw).text)
    assert after * 5 <= before, (name, before, after)

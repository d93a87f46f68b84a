"""Where a live stream begins inside the engine's log (pure logic of the re-attach)."""

from __future__ import annotations

import pytest

from supervisor.core.resync import (
    COPIER_CHUNK,
    Message,
    after_anchor,
    drop_known,
    engine_log_bytes,
    live_cut,
    log_bytes,
    log_length,
    logged_prefix_by_lines,
    overlap,
    split_messages,
    split_stamp,
)


def copier_log(stream: bytes, chunk: int = COPIER_CHUNK) -> bytes:
    """What the engine's copier has logged of ``stream`` so far: whole lines, and pieces of
    ``chunk`` bytes of a longer unfinished line (a model of daemon/logger/copier.go)."""
    logged = stream.rfind(b"\n") + 1
    unfinished = len(stream) - logged
    return engine_log_bytes(stream[: len(stream) - unfinished % chunk])


def test_valid_utf8_is_unchanged() -> None:
    assert engine_log_bytes("héllo ✓\n".encode()) == "héllo ✓\n".encode()


def test_each_invalid_byte_becomes_one_replacement_character() -> None:
    assert engine_log_bytes(b"a\xffb\xe2\x82") == "a\ufffdb\ufffd\ufffd".encode()
    assert engine_log_bytes(b"\xed\xa0\x80") == "\ufffd\ufffd\ufffd".encode()


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        (b"line1\nline2\n", 12),
        (b"line1\nline", 6),
        (b"\n", 1),
        (b"x" * 5 + b"\n" + b"y" * (COPIER_CHUNK + 7), 6 + COPIER_CHUNK),
        (b"\n" + b"y" * (2 * COPIER_CHUNK), 1 + 2 * COPIER_CHUNK),
    ],
)
def test_logged_prefix_follows_the_copier_line_rule(live: bytes, expected: int) -> None:
    assert logged_prefix_by_lines(live) == expected


def test_without_a_newline_the_lines_cannot_tell() -> None:
    assert logged_prefix_by_lines(b"partial") is None
    assert logged_prefix_by_lines(b"") is None


@pytest.mark.parametrize("split", [0, 1, 5, 300, COPIER_CHUNK - 1, COPIER_CHUNK + 3])
def test_logged_prefix_matches_a_model_of_the_copier(split: int) -> None:
    stream = b"".join(f"line{i}\n".encode() for i in range(3000)) + b"z" * 20000
    before, live = stream[:split], stream[split:]
    logged = logged_prefix_by_lines(live)
    assert logged is not None
    log = copier_log(stream)
    # The log is the part before the live stream plus exactly the first `logged` live bytes.
    assert log == engine_log_bytes(before + live[:logged])


def test_overlap_finds_where_an_unfinished_line_was_cut() -> None:
    # A progress bar: no newline for a long time; the copier logged a 16 KiB piece that
    # ends 100 bytes into the live stream.
    line = b"".join(f"\r{i:05d}%".encode() for i in range(10000))
    start = COPIER_CHUNK - 100  # the live stream begins here in the unfinished line
    log = b"done\n" + line[:COPIER_CHUNK]
    live = line[start : start + 500]
    assert overlap(log, live) == 100


def test_overlap_is_zero_when_the_log_ends_before_the_live_stream() -> None:
    assert overlap(b"first\nsecond\n", b"third without newline") == 0
    assert overlap(b"", b"anything") == 0
    assert overlap(b"log", b"") == 0


def test_overlap_counts_raw_bytes_where_the_log_replaced_invalid_ones() -> None:
    live = b"\xff\xfeab" + b"c" * 100
    log = b"older\n" + engine_log_bytes(b"zz" + live[:70])
    assert overlap(log, live) == 70


def test_overlap_prefers_the_longest_match() -> None:
    live = b"ab" * 100
    log = b"\n" + live[:150]
    assert overlap(log, live) == 150


def _msg(t: int, payload: bytes, kind: int = 1) -> Message:
    return kind, f"2026-12-01T05:00:00.{t:09d}Z".encode(), payload


def test_split_stamp_reads_the_engine_time_prefix() -> None:
    frame = b"2026-12-01T05:56:52.123456789Z line one\n"
    assert split_stamp(1, frame) == (1, b"2026-12-01T05:56:52.123456789Z", b"line one\n")
    assert split_stamp(1, b"line without a time\n") is None
    assert split_stamp(1, b"2026-12-01T05:56:52Z short\n") is None


def test_after_anchor_keeps_what_follows_the_last_message_read() -> None:
    tail = [_msg(1, b"a\n"), _msg(2, b"b\n"), _msg(3, b"c\n"), _msg(4, b"d\n")]
    after = after_anchor(tail, _msg(2, b"")[1], 1, whole_log=False)
    assert after is not None
    assert [p for _, _, p in after] == [b"c\n", b"d\n"]


def test_after_anchor_counts_pieces_that_share_a_time() -> None:
    # A long line's pieces all carry its first piece's time; two of three were read.
    tail = [_msg(1, b"x\n"), _msg(5, b"p1"), _msg(5, b"p2"), _msg(5, b"p3\n"), _msg(6, b"y\n")]
    after = after_anchor(tail, _msg(5, b"")[1], 2, whole_log=False)
    assert after is not None
    assert [p for _, _, p in after] == [b"p3\n", b"y\n"]


def test_after_anchor_wants_a_longer_tail_until_it_reaches_back() -> None:
    tail = [_msg(5, b"p2"), _msg(5, b"p3\n"), _msg(6, b"y\n")]
    assert after_anchor(tail, _msg(5, b"")[1], 1, whole_log=False) is None
    assert after_anchor(tail[2:], _msg(5, b"")[1], 1, whole_log=False) is None
    # The whole log: nothing older exists, so the anchor counts as reached.
    whole = after_anchor(tail, _msg(5, b"")[1], 1, whole_log=True)
    assert whole is not None
    assert [p for _, _, p in whole] == [b"p3\n", b"y\n"]


def test_after_anchor_with_an_empty_log_before_takes_everything() -> None:
    tail = [_msg(1, b"a\n"), _msg(2, b"b\n")]
    assert after_anchor(tail, b"", 0, whole_log=False) is None
    assert after_anchor(tail, b"", 0, whole_log=True) == tail


def test_after_anchor_distrusts_times_out_of_order() -> None:
    tail = [_msg(1, b"a\n"), _msg(3, b"b\n"), _msg(2, b"c\n")]
    assert after_anchor(tail, _msg(1, b"")[1], 1, whole_log=True) is None


def test_drop_known_skips_each_streams_stored_bytes_once() -> None:
    skip = {1: 5, 2: 1}
    segments: list[tuple[int, bytes | memoryview]] = [
        (1, b"abc"),
        (2, b"XY"),
        (1, b"defgh"),
        (1, b"ij"),
    ]
    assert drop_known(skip, segments) == [(2, b"Y"), (1, b"fgh"), (1, b"ij")]
    assert skip == {1: 0, 2: 0}
    assert drop_known(skip, [(1, b"new")]) == [(1, b"new")]


def test_log_length_counts_a_character_split_by_the_copiers_cut_twice() -> None:
    line = b"y" * (COPIER_CHUNK - 1) + "é".encode() + b"\n"
    # Piece one ends with the first byte of "é", piece two starts with the second: each
    # comes back as U+FFFD (3 bytes) instead of 2 bytes for the whole character.
    assert log_length(line) == (COPIER_CHUNK - 1) + 3 + 3 + 1
    assert log_length("é\n".encode() * 3) == 9  # short lines: unchanged
    assert log_length(b"a\xff\n") == 1 + 3 + 1  # invalid byte: one U+FFFD
    # Reading in blocks gives the same count as reading at once, whatever the split.
    data = line * 3 + b"tail" + b"z" * (2 * COPIER_CHUNK + 7)
    for size in (1000, COPIER_CHUNK - 1, COPIER_CHUNK + 3, 50_000):
        total, carry = 0, b""
        for i in range(0, len(data), size):
            last = i + size >= len(data)
            whole, carry = split_messages(carry + data[i : i + size], final=last)
            total += log_length(whole)
        assert total + log_length(carry) == log_length(data)


def test_live_cut_knows_a_character_the_copiers_cut_split() -> None:
    line = b"y" * (COPIER_CHUNK - 1) + "é".encode() + b"\n"
    log = b"older\n" + log_bytes(line) + b"x\n"
    assert log_bytes(line) == b"y" * (COPIER_CHUNK - 1) + "\ufffd\ufffd\n".encode()
    # The live stream began at a message (the line) or inside the line before it: the
    # part of the log it holds is the line as the log stores it, U+FFFD twice, not "é".
    for before, live in ((b"older\n", line + b"x\n"), (b"ol", b"der\n" + line + b"x\n")):
        cut, unverified = live_cut({1: live, 2: b""}, {1: log, 2: b""}, ended=False)
        assert unverified == []
        assert cut[1] == len(log) - len(before)
    # The line the live stream began in is split at an unknown place: said, not guessed.
    live = line[100:] + b"x\n"
    assert live_cut({1: live}, {1: log}, ended=False)[1] == [1]

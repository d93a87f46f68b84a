"""FrameDemux: the engine's 8-byte-header multiplexed stream, fed in arbitrary pieces."""

from __future__ import annotations

import itertools
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.core.demux import STDERR, STDIN, STDOUT, FrameDemux, encode_frame
from tests.conftest import examples

Frames = list[tuple[int, bytes]]


def normalized(frames: Frames) -> Frames:
    """What a consumer should see: empty payloads gone, adjacent same-stream payloads joined."""
    out: Frames = []
    for raw_stream, payload in frames:
        stream = raw_stream if raw_stream in (STDOUT, STDERR) else STDOUT
        if not payload:
            continue
        if out and out[-1][0] == stream:
            out[-1] = (stream, out[-1][1] + payload)
        else:
            out.append((stream, payload))
    return out


def feed_in_pieces(raw: bytes, cuts: list[int]) -> tuple[FrameDemux, list[Frames]]:
    demux = FrameDemux()
    bounds = [0, *sorted(set(cuts)), len(raw)]
    per_feed = [demux.feed(raw[a:b]) for a, b in itertools.pairwise(bounds)]
    return demux, per_feed


frames_strategy = st.lists(
    st.tuples(st.sampled_from([STDOUT, STDERR]), st.binary(max_size=40)), max_size=12
)


def test_encode_frame_header_layout() -> None:
    frame = encode_frame(STDERR, b"abc")
    assert frame == b"\x02\x00\x00\x00\x00\x00\x00\x03abc"
    assert struct.unpack(">BxxxI", frame[:8]) == (2, 3)


def test_single_feed_of_whole_frames() -> None:
    raw = encode_frame(STDOUT, b"hello ") + encode_frame(STDERR, b"oops") + encode_frame(1, b"!")
    demux = FrameDemux()
    assert demux.feed(raw) == [(STDOUT, b"hello "), (STDERR, b"oops"), (STDOUT, b"!")]
    assert not demux.mid_frame


def test_adjacent_same_stream_payloads_are_joined_within_one_feed() -> None:
    raw = encode_frame(STDOUT, b"a") + encode_frame(STDOUT, b"b") + encode_frame(STDOUT, b"c")
    assert FrameDemux().feed(raw) == [(STDOUT, b"abc")]


def test_zero_length_frame_yields_nothing_and_does_not_split_a_run() -> None:
    demux = FrameDemux()
    assert demux.feed(encode_frame(STDERR, b"")) == []
    assert not demux.mid_frame
    raw = encode_frame(STDOUT, b"x") + encode_frame(STDERR, b"") + encode_frame(STDOUT, b"y")
    assert demux.feed(raw) == [(STDOUT, b"xy")]


def test_stderr_frames_keep_their_stream() -> None:
    raw = encode_frame(STDERR, b"e1") + encode_frame(STDERR, b"e2") + encode_frame(STDOUT, b"o")
    assert FrameDemux().feed(raw) == [(STDERR, b"e1e2"), (STDOUT, b"o")]


def test_unknown_stream_ids_are_treated_as_stdout() -> None:
    raw = encode_frame(STDIN, b"in") + encode_frame(7, b"??")
    assert FrameDemux().feed(raw) == [(STDOUT, b"in??")]


def test_payload_is_returned_before_its_frame_completes() -> None:
    demux = FrameDemux()
    raw = encode_frame(STDOUT, b"0123456789")
    assert demux.feed(raw[:5]) == []  # header incomplete
    assert demux.mid_frame
    assert demux.feed(raw[5:12]) == [(STDOUT, b"0123")]
    assert demux.mid_frame
    assert demux.feed(raw[12:]) == [(STDOUT, b"456789")]
    assert not demux.mid_frame


def test_empty_feed_changes_nothing() -> None:
    demux = FrameDemux()
    assert demux.feed(b"") == []
    assert not demux.mid_frame


@settings(max_examples=examples(300), deadline=None)
@given(frames=frames_strategy, data=st.data())
def test_any_split_reassembles_to_the_same_segments(frames: Frames, data: st.DataObject) -> None:
    raw = b"".join(encode_frame(s, p) for s, p in frames)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=20), label="cuts")
    demux, per_feed = feed_in_pieces(raw, cuts)
    for segments in per_feed:
        # within one feed: no empty payloads, no two adjacent segments of the same stream
        assert all(payload for _, payload in segments)
        assert all(a[0] != b[0] for a, b in itertools.pairwise(segments))
    flat = normalized([seg for segments in per_feed for seg in segments])
    assert flat == normalized(frames)
    assert not demux.mid_frame


@settings(max_examples=examples(50), deadline=None)
@given(frames=frames_strategy.filter(lambda f: any(p for _, p in f)))
def test_every_single_byte_boundary(frames: Frames) -> None:
    raw = b"".join(encode_frame(s, p) for s, p in frames)
    _, per_feed = feed_in_pieces(raw, list(range(len(raw) + 1)))
    assert normalized([seg for segments in per_feed for seg in segments]) == normalized(frames)
    for segments in per_feed:
        assert len(segments) <= 1  # one byte can continue at most one payload


def test_mid_frame_reports_a_truncated_stream() -> None:
    raw = encode_frame(STDOUT, b"abcdef")
    for cut in range(1, len(raw)):
        demux = FrameDemux()
        demux.feed(raw[:cut])
        assert demux.mid_frame, cut


def test_feed_frames_returns_whole_frames_only() -> None:
    data = encode_frame(1, b"first message\n") + encode_frame(2, b"") + encode_frame(1, b"x" * 40)
    for cut in range(len(data) + 1):
        demux = FrameDemux()
        frames = demux.feed_frames(data[:cut]) + demux.feed_frames(data[cut:])
        assert frames == [(1, b"first message\n"), (2, b""), (1, b"x" * 40)], cut

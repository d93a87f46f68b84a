"""OutputFile (real file + thread pool), read_slice, read_tail, utf8_safe_end."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.text import utf8_safe_end
from supervisor.state.output import (
    HEAD_BYTES,
    OutputFile,
    cap_marker,
    dropped_marker,
    gap_marker,
    read_slice,
    read_tail,
)

TEXT = "aé€😀b\n" * 3 + "ü😀"  # 1-, 2-, 3- and 4-byte characters
DATA = TEXT.encode()


@pytest.fixture
def io() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2)
    yield pool
    pool.shutdown(wait=True)


async def open_file(path: Path, cap: int, io: ThreadPoolExecutor) -> OutputFile:
    out = OutputFile(path, cap, io)
    await out.open()
    return out


# -- OutputFile -----------------------------------------------------------------------------


async def test_append_under_the_cap(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    path = tmp_path / "sub" / "t.output"
    out = await open_file(path, 1024, io)
    await out.append(b"hello ")
    await out.append(b"")
    await out.append(b"world\n")
    await out.close()
    assert path.read_bytes() == b"hello world\n"
    assert (out.task_bytes, out.file_size, out.dropped) == (12, 12, 0)


async def test_cap_keeps_exactly_cap_bytes_and_marks_once(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 100, io)
    payload = bytes(range(33, 33 + 70)) * 3  # 210 bytes in 30-byte appends
    for i in range(0, len(payload), 30):
        await out.append(payload[i : i + 30])
    await out.flush()  # written behind the caller: wait for the file
    assert out.task_bytes == 100
    assert out.dropped == 110
    before_close = path.read_bytes()
    assert before_close == payload[:100] + cap_marker(100)
    await out.close()
    await out.close()  # idempotent
    content = path.read_bytes()
    assert content == payload[:100] + cap_marker(100) + dropped_marker(110)
    assert content.count(b"output cap of 100 bytes reached") == 1
    assert out.file_size == len(content)


async def test_one_append_crossing_the_cap(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 10, io)
    await out.append(b"0123456789ABCDEF")
    await out.close()
    assert path.read_bytes() == b"0123456789" + cap_marker(10) + dropped_marker(6)


async def test_output_exactly_at_the_cap_needs_no_marker(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 10, io)
    await out.append(b"0123456789")
    await out.close()
    assert path.read_bytes() == b"0123456789"
    assert out.dropped == 0


async def test_cap_marker_when_an_append_ends_exactly_at_the_cap(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 10, io)
    await out.append(b"0123456789")
    await out.append(b"more")
    await out.flush()
    assert path.read_bytes() == b"0123456789" + cap_marker(10)


async def test_appends_are_batched_behind_the_caller(
    tmp_path: Path, io: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one write is in flight, later appends queue up and go out in one writev."""
    path = tmp_path / "t.output"
    out = await open_file(path, 1 << 20, io)
    calls: list[int] = []
    real_write = OutputFile._write_all

    def write_all(self: OutputFile, data: list[bytes]) -> tuple[int, OSError | None]:
        calls.append(len(data))
        return real_write(self, data)

    monkeypatch.setattr(OutputFile, "_write_all", write_all)
    for i in range(100):
        await out.append(b"line %d\n" % i)
    await out.close()
    assert path.read_bytes() == b"".join(b"line %d\n" % i for i in range(100))
    assert out.task_bytes == path.stat().st_size
    assert len(calls) < 10  # not one thread hop per append
    assert sum(calls) == 100


async def test_appends_wait_when_too_much_is_queued(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    path = tmp_path / "t.output"
    out = OutputFile(path, 1 << 30, io, high_water=1024)
    await out.open()
    await out.append(b"x" * 4096)  # over the high-water mark: returns once written
    assert out.task_bytes == 4096
    await out.close()


async def test_reopen_appends_and_keeps_counting(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 8, io)
    await out.append(b"abcd")
    await out.close()
    again = OutputFile(path, 8, io)
    await again.open(task_bytes=4)
    assert again.file_size == 4
    await again.append(b"efghij")
    await again.close()
    assert path.read_bytes() == b"abcdefgh" + cap_marker(8) + dropped_marker(2)


async def test_note_gap(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 1024, io)
    await out.append(b"a")
    await out.note_gap(500, "rotated away by the engine")
    await out.close()
    assert path.read_bytes() == b"a" + gap_marker(500, "rotated away by the engine")
    assert out.task_bytes == 1


async def test_full_disk_becomes_a_gap_marker(
    tmp_path: Path, io: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 1024, io)
    await out.append(b"before\n")
    await out.flush()
    real_write = OutputFile._write_all
    full = True

    def write_all(self: OutputFile, data: list[bytes]) -> tuple[int, OSError | None]:
        if full:
            return 0, OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(OutputFile, "_write_all", write_all)
    await out.append(b"lost 1\n")
    await out.flush()
    await out.append(b"lost 2\n")
    await out.flush()
    assert out.gap_bytes == 14
    full = False
    await out.append(b"after\n")
    await out.close()
    assert path.read_bytes() == b"before\n" + gap_marker(14, "the disk was full") + b"after\n"
    assert out.task_bytes == len(b"before\nafter\n")


async def test_a_short_write_on_a_full_disk_keeps_what_fit(
    tmp_path: Path, io: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.output"
    out = await open_file(path, 1024, io)
    real_write = OutputFile._write_all

    def write_all(self: OutputFile, data: list[bytes]) -> tuple[int, OSError | None]:
        if b"".join(data) == b"0123456789":
            written, _ = real_write(self, [data[0][:4]])
            return written, OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(OutputFile, "_write_all", write_all)
    await out.append(b"0123456789")
    await out.flush()
    assert (out.task_bytes, out.gap_bytes) == (4, 6)
    await out.append(b"ok\n")
    await out.close()
    assert path.read_bytes() == b"0123" + gap_marker(6, "the disk was full") + b"ok\n"


# -- read_slice ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "end"),
    [
        (b"", 0),
        (b"abc", 3),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),
        (b"a" + "€".encode()[:2], 1),
        (b"a" + "€".encode(), 4),
        (b"a" + "😀".encode()[:3], 1),
        (b"a" + "😀".encode(), 5),
        (b"\x80\x80", 2),  # stray continuation bytes: nothing to wait for
        (b"a\xff", 2),  # invalid lead byte
    ],
)
def testutf8_safe_end(data: bytes, end: int) -> None:
    assert utf8_safe_end(data) == end


@given(st.text(max_size=20), st.integers(0, 3))
def testutf8_safe_end_property(text: str, chop: int) -> None:
    data = text.encode("utf-8", "surrogatepass")
    data = data[: max(0, len(data) - chop)]
    end = utf8_safe_end(data)
    assert len(data) - 3 <= end <= len(data)
    data[:end].decode("utf-8", "surrogatepass")  # the kept part decodes cleanly


async def read_all(path: Path, limit: int, *, ended: bool, io: ThreadPoolExecutor) -> list[bytes]:
    parts: list[bytes] = []
    offset = 0
    for _ in range(10_000):
        sl = await read_slice(path, offset, limit, ended=ended, io=io)
        assert sl.offset == offset
        assert sl.next_offset == offset + len(sl.data)
        assert len(sl.data) <= limit
        if not sl.data:
            assert sl.eof is ended
            return parts
        assert sl.eof is (ended and sl.next_offset == len(DATA))
        parts.append(sl.data)
        offset = sl.next_offset
    raise AssertionError("read_slice made no progress")


@pytest.mark.parametrize("limit", range(1, 21))
async def test_stitched_slices_equal_the_file(
    tmp_path: Path, io: ThreadPoolExecutor, limit: int
) -> None:
    path = tmp_path / "t.output"
    path.write_bytes(DATA)
    parts = await read_all(path, limit, ended=True, io=io)
    assert b"".join(parts) == DATA
    end = 0
    for p in parts:
        end += len(p)
        at_boundary = end == len(DATA) or (DATA[end] & 0xC0) != 0x80
        # a slice ends inside a character only when the limit leaves no other way to progress
        # (no character boundary inside the slice it could have been cut back to)
        assert at_boundary or all((b & 0xC0) == 0x80 for b in p[1:]), (limit, p)
    if limit >= 4:
        # every slice ends on a character boundary, so each one decodes on its own
        assert "".join(p.decode("utf-8") for p in parts) == TEXT


async def test_slice_ending_at_file_end_may_end_mid_character(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    path = tmp_path / "t.output"
    partial = b"ab" + "€".encode()[:2]  # the command is mid-write
    path.write_bytes(partial)
    sl = await read_slice(path, 0, 100, ended=False, io=io)
    assert (sl.data, sl.eof) == (partial, False)
    assert sl.lossy
    mid = await read_slice(path, 0, 3, ended=False, io=io)
    assert mid.data == b"ab"  # not the end of the file: held back


async def test_eof_only_when_ended(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    path = tmp_path / "t.output"
    path.write_bytes(b"abc")
    assert (await read_slice(path, 0, 10, ended=False, io=io)).eof is False
    assert (await read_slice(path, 0, 10, ended=True, io=io)).eof is True
    assert (await read_slice(path, 0, 2, ended=True, io=io)).eof is False
    beyond = await read_slice(path, 50, 10, ended=True, io=io)
    assert (beyond.data, beyond.next_offset, beyond.eof) == (b"", 50, True)
    missing = await read_slice(tmp_path / "none", 0, 10, ended=False, io=io)
    assert (missing.data, missing.eof) == (b"", False)
    assert (await read_slice(tmp_path / "none", 0, 10, ended=True, io=io)).eof is True


# -- read_tail ------------------------------------------------------------------------------


@pytest.mark.parametrize("chars", [0, 1, 2, 3, 5, 8, 19, 23, 100])
async def test_read_tail_returns_the_last_characters(
    tmp_path: Path, io: ThreadPoolExecutor, chars: int
) -> None:
    path = tmp_path / "t.output"
    path.write_bytes(DATA)
    tail = await read_tail(path, chars, io=io)
    assert tail == (TEXT[-chars:] if chars else "")


async def test_read_tail_replaces_invalid_bytes(tmp_path: Path, io: ThreadPoolExecutor) -> None:
    path = tmp_path / "t.output"
    path.write_bytes(b"ok \xff\xfe end" + "€".encode()[:2])
    assert (
        await read_tail(path, 8, io=io) == " \ufffd\ufffd end\ufffd"
    )  # a cut-off character at the end is one U+FFFD
    assert await read_tail(tmp_path / "missing", 10, io=io) == ""


async def test_read_tail_default_executor(tmp_path: Path) -> None:
    path = tmp_path / "t.output"
    path.write_bytes(DATA)
    assert await read_tail(path, 3) == TEXT[-3:]


async def test_reads_of_a_short_file_come_from_memory_exactly_as_from_the_file(
    tmp_path: Path, io: ThreadPoolExecutor
) -> None:
    """A file this writer started keeps its first HEAD_BYTES in memory: every read of it
    answers what the file itself answers (markers included), until it outgrows that."""
    path = tmp_path / "o.out"
    out = await open_file(path, 40, io)

    async def same_as_the_file(offset: int, limit: int) -> None:
        mem = await read_slice(path, offset, limit, ended=False, io=io, writer=out)
        disk = await read_slice(path, offset, limit, ended=False, io=io)
        assert mem == disk

    assert out.head_range(0, 10) == (b"", 0)
    await out.append(DATA[:7])
    await out.flush()
    assert out.head_range(0, 100) == (DATA[:7], 7)
    await out.append(DATA[7:] + b"x" * 40)  # crosses the cap: a marker lands in the file
    await out.flush()
    for offset, limit in [(0, 1), (0, 100), (3, 5), (5, 1), (37, 10), (500, 4)]:
        await same_as_the_file(offset, limit)
    head = out.head_range(0, 1 << 20)
    assert head is not None and head[0] == path.read_bytes()
    # Past HEAD_BYTES the copy is dropped for good: reads go to the file.
    big = OutputFile(tmp_path / "big.out", 1 << 20, io)
    await big.open()
    await big.append(b"y" * (HEAD_BYTES - 1))
    await big.flush()
    assert big.head_range(0, 1) == (b"y", HEAD_BYTES - 1)
    await big.append(b"zz")
    await big.flush()
    assert big.head_range(0, 1) is None
    await big.close()
    # A file reopened with bytes in it (a re-adopted task) was not all written here.
    again = OutputFile(path, 1 << 20, io)
    await again.open()
    assert again.head_range(0, 1) is None
    await again.close()
    await out.close()
    assert out.head_range(0, 1) is None  # an ended task's reads go to its file

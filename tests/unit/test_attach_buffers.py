"""The attach protocol's buffers: a flood reuses its large buffers, but never one that a
segment not yet written out still points into."""

from __future__ import annotations

import itertools

from supervisor.backend.docker import _CHUNK, _AttachProtocol


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def feed(proto: _AttachProtocol, data: bytes) -> set[int]:
    """Deliver ``data`` the way the event loop does; return the buffers it landed in."""
    used: set[int] = set()
    pos = 0
    while pos < len(data):
        view = proto.get_buffer(-1)
        used.add(id(view.obj))
        n = min(len(view), len(data) - pos)
        view[:n] = data[pos : pos + n]
        del view
        proto.buffer_updated(n)
        pos += n
    return used


def payload_of(segments: list[tuple[int, bytes | memoryview]]) -> bytes:
    return b"".join(bytes(seg) for _, seg in segments)


async def test_flood_reuses_released_buffers_and_never_overwrites_held_ones() -> None:
    proto = _AttachProtocol(b"")
    feed(proto, b"HTTP/1.1 101 UPGRADED\r\nContent-Type: x\r\n\r\n")
    counter = itertools.count()
    chunks = [bytes([next(counter) % 251]) * 65536 for _ in range(64)]  # 4 MiB, distinct
    stream = b"".join(frame(1 + i % 2, c) for i, c in enumerate(chunks))

    # First 4 MiB: taken and *held* (not written out yet).
    feed(proto, stream)
    held = await proto.next_segments()
    assert held is not None

    # Another 4 MiB arrives while those views are alive: it must land in other buffers.
    more = [bytes([next(counter) % 251]) * 65536 for _ in range(64)]
    feed(proto, b"".join(frame(1, c) for c in more))
    assert payload_of(held) == b"".join(chunks)  # untouched by the later bytes
    second = await proto.next_segments()
    assert second is not None
    assert payload_of(second) == b"".join(more)

    # Everything written out (views gone): the next flood reuses the large buffers.
    del held, second
    third = [bytes([next(counter) % 251]) * 65536 for _ in range(256)]  # 16 MiB
    used: set[int] = set()
    got = b""
    for i in range(0, len(third), 16):
        used |= feed(proto, b"".join(frame(1, c) for c in third[i : i + 16]))
        segs = await proto.next_segments()
        assert segs is not None
        got += payload_of(segs)
        del segs
    assert got == b"".join(third)
    large = len(third) * 65536 // _CHUNK
    assert len(used) < large, (len(used), large)


async def test_a_quiet_stream_keeps_no_spare_large_buffers() -> None:
    proto = _AttachProtocol(b"")
    feed(proto, b"HTTP/1.1 101 UPGRADED\r\n\r\n")
    feed(proto, b"".join(frame(1, b"x" * 65536) for _ in range(64)))
    segs = await proto.next_segments()
    assert segs is not None
    del segs
    proto._buf_since -= 1.0  # the last buffer filled slowly: the stream went quiet
    proto._pos = len(proto._buf)
    feed(proto, frame(1, b"tick\n"))
    assert proto._spares == []
    assert len(proto._buf) < _CHUNK

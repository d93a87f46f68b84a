"""Pure decoder for the engine's multiplexed attach/log stream (8-byte frame headers)."""

from __future__ import annotations

import struct

STDIN, STDOUT, STDERR = 0, 1, 2
_HEADER = struct.Struct(">BxxxI")


class FrameDemux:
    """Feed raw stream bytes; get ``(stream, payload)`` segments back in arrival order.

    Payloads are returned as soon as they arrive, not when their frame is complete, so a
    1 GiB frame never sits in memory. ``feed_views`` is the hot path: zero-copy views into
    the fed buffer, one per frame piece (write them with ``os.writev``); ``feed`` joins
    adjacent pieces of the same stream into bytes.
    """

    __slots__ = ("_frame", "_header", "_remaining", "_stream")

    def __init__(self) -> None:
        self._header = b""
        self._remaining = 0
        self._stream = STDOUT
        self._frame = bytearray()

    @property
    def mid_frame(self) -> bool:
        """True when the last feed ended inside a frame (header or payload)."""
        return bool(self._header) or self._remaining > 0

    def feed_views(self, data: bytes | memoryview) -> list[tuple[int, memoryview]]:
        """Decode ``data``; payload pieces as views into it (valid while ``data`` lives)."""
        out: list[tuple[int, memoryview]] = []
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            if self._remaining == 0:
                need = 8 - len(self._header)
                if end - pos < need:
                    self._header += bytes(view[pos:end])
                    break
                if self._header:
                    header = self._header + bytes(view[pos : pos + need])
                    self._header = b""
                    stream, size = _HEADER.unpack(header)
                else:
                    stream, size = _HEADER.unpack_from(data, pos)
                pos += need
                self._stream = stream if stream in (STDOUT, STDERR) else STDOUT
                self._remaining = size
                continue
            take = min(self._remaining, end - pos)
            out.append((self._stream, view[pos : pos + take]))
            pos += take
            self._remaining -= take
        return out

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Decode ``data``; adjacent pieces of the same stream joined into bytes."""
        out: list[tuple[int, bytes]] = []
        group: list[memoryview] = []
        current = -1
        for stream, piece in self.feed_views(data):
            if stream != current and group:
                out.append((current, b"".join(group)))
                group = []
            current = stream
            group.append(piece)
        if group:
            out.append((current, b"".join(group)))
        return out

    def feed_frames(self, data: bytes) -> list[tuple[int, bytes]]:
        """Decode ``data``; whole frames only (a frame cut by the end of ``data`` is kept
        until the rest arrives). For streams whose frames are small and meaningful: the
        engine's log writes one frame per message."""
        out: list[tuple[int, bytes]] = []
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            if self._remaining == 0 and not self._frame:
                need = 8 - len(self._header)
                if end - pos < need:
                    self._header += bytes(view[pos:end])
                    break
                header = self._header + bytes(view[pos : pos + need])
                self._header = b""
                pos += need
                stream, size = _HEADER.unpack(header)
                self._stream = stream if stream in (STDOUT, STDERR) else STDOUT
                self._remaining = size
                if size == 0:
                    out.append((self._stream, b""))
                continue
            take = min(self._remaining, end - pos)
            self._frame += view[pos : pos + take]
            pos += take
            self._remaining -= take
            if self._remaining == 0:
                out.append((self._stream, bytes(self._frame)))
                self._frame.clear()
        return out


def encode_frame(stream: int, payload: bytes) -> bytes:
    """Encode one frame (used by tests and the fake backend)."""
    return _HEADER.pack(stream, len(payload)) + payload

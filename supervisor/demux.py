"""Pure decoder for the engine's multiplexed attach/log stream (8-byte frame headers)."""

from __future__ import annotations

import struct

STDIN, STDOUT, STDERR = 0, 1, 2
_HEADER = struct.Struct(">BxxxI")


class FrameDemux:
    """Feed raw stream bytes; get ``(stream, payload)`` segments back in arrival order.

    Payloads are returned as soon as they arrive, not when their frame is complete, so a
    1 GiB frame never sits in memory. Adjacent segments of the same stream are joined to
    keep the number of downstream writes low.
    """

    __slots__ = ("_header", "_remaining", "_stream")

    def __init__(self) -> None:
        self._header = b""
        self._remaining = 0
        self._stream = STDOUT

    @property
    def mid_frame(self) -> bool:
        """True when the last feed ended inside a frame (header or payload)."""
        return bool(self._header) or self._remaining > 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """Decode ``data``; return the payload segments it completes or continues."""
        out: list[tuple[int, bytes]] = []
        view = memoryview(data)
        pos, end = 0, len(data)
        while pos < end:
            if self._remaining == 0:
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
                continue
            take = min(self._remaining, end - pos)
            chunk = bytes(view[pos : pos + take])
            pos += take
            self._remaining -= take
            if out and out[-1][0] == self._stream:
                out[-1] = (self._stream, out[-1][1] + chunk)
            else:
                out.append((self._stream, chunk))
        return out


def encode_frame(stream: int, payload: bytes) -> bytes:
    """Encode one frame (used by tests and the fake backend)."""
    return _HEADER.pack(stream, len(payload)) + payload

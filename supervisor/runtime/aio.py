"""Small asyncio helpers the runtime shares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def first_of(*waits: Awaitable[object], timeout: float | None) -> None:
    """Return when the first of ``waits`` completes or ``timeout`` passes; cancel the rest."""
    futures = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(futures, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futures:
            f.cancel()

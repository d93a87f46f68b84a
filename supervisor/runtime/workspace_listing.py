"""The walk a first page of a workspace's changes made, kept for the pages after it.

Walking an upper of 200 000 entries takes seconds; a page of them costs milliseconds. A
listing read page by page (the CLI's, an apply's review) would walk once a page; instead
the pages after a first one are cut from its walk while it is young, so they are one
snapshot too (nothing skipped or listed twice when a task writes between two pages).
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from supervisor.state.workspace import Change

#: How long the pages after a first one are cut from its walk (then they walk again).
LISTING_KEPT_S: Final = 60.0


class KeptListing:
    """One workspace's last walk: taken by a first page, dropped when it is too old, and
    whenever the upper or the host tree is rewritten (apply, undo, discard)."""

    def __init__(self, kept_s: float = LISTING_KEPT_S) -> None:
        self.kept_s = kept_s
        self._listing: tuple[float, list[Change]] | None = None
        self._generation = 0

    @property
    def generation(self) -> int:
        """Moves on at every ``forget``: a walk begun before it is not kept."""
        return self._generation

    def get(self) -> list[Change] | None:
        """The kept walk, or None when there is none or it is too old."""
        if self._listing is None or time.monotonic() - self._listing[0] > self.kept_s:
            self._listing = None
            return None
        return self._listing[1]

    def put(self, listing: list[Change], generation: int) -> None:
        """Keep ``listing`` (a walk begun at ``generation``), unless it was forgotten since."""
        if generation != self._generation:
            return
        stamp = time.monotonic()
        self._listing = (stamp, listing)
        # A listing of 200 000 changes holds tens of MB: not kept past its use.
        asyncio.get_running_loop().call_later(self.kept_s, self._expire, stamp)

    def forget(self) -> None:
        self._listing = None
        self._generation += 1

    def _expire(self, stamp: float) -> None:
        if self._listing is not None and self._listing[0] == stamp:
            self._listing = None

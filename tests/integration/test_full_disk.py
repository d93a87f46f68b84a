"""A full state volume: new tasks are refused, output that cannot be stored becomes a counted
gap, nothing crashes, and capture resumes when space returns."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from supervisor import StateStorageError, Supervisor, TaskSpec
from tests.conftest import require_engine

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: a state volume we can fill without touching the host's disk."""
    vol = tmp_path / "vol"
    vol.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(vol)], check=True)
    try:
        yield vol
    finally:
        subprocess.run(["umount", "-l", str(vol)], check=False)


def fill(path: Path) -> None:
    """Write until the volume says ENOSPC."""
    with path.open("wb") as fh:
        block = b"\0" * (1 << 20)
        try:
            while True:
                fh.write(block)
                fh.flush()
        except OSError:
            pass


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_full_state_volume(small_volume: Path, policies_dir: Path) -> None:
    require_engine()
    async with Supervisor(
        state_dir=small_volume / "state", policies_dir=policies_dir, min_free_bytes=4 << 20
    ) as sup:
        session = await sup.open_session("disk")
        info = await session.start(
            TaskSpec(
                command="i=0; while true; do i=$((i+1)); echo line$i; sleep 0.005; done",
                policy="fast",
                persistent=True,
            )
        )
        await session.wait_for(info.task_id, "^line50$", timeout_s=30)
        filler = small_volume / "filler"
        await asyncio.to_thread(fill, filler)
        # New work is refused with a clear error.
        with pytest.raises(StateStorageError, match="full"):
            await session.start(TaskSpec(command="echo refused", policy="fast"))

        async def gap_counted() -> bool:
            return (await session.get(info.task_id)).gap_bytes > 0

        await until(gap_counted)
        # Space returns: capture resumes and the gap is written down with its size.
        filler.unlink()

        async def resumed() -> bool:
            data = Path(info.output_path).read_bytes()
            at = data.find(b"missing here")
            return at >= 0 and data.count(b"\n", at) > 20

        await until(resumed)
        later = await session.start(TaskSpec(command="echo accepted", policy="fast"))
        assert (await session.wait(later.task_id, timeout_s=30)).status == "completed"
        final = await session.stop(info.task_id)
        assert final.reason == "user_stopped"
        data = Path(info.output_path).read_bytes()
        marker = re.search(
            rb"\n\[sandvisor: (\d+) bytes of output missing here: the disk was full\]\n", data
        )
        assert marker is not None
        missing = int(marker.group(1))
        assert missing == final.gap_bytes > 0
        # Every byte is accounted for: what the command printed is exactly the text before
        # the marker, then `missing` bytes, then the text after it.
        before, after = data[: marker.start()], data[marker.end() :]
        printed = b"".join(b"line%d\n" % i for i in range(1, 1_000_000))
        assert printed[: len(before)] == before
        resume_at = len(before) + missing
        assert printed[resume_at : resume_at + len(after)] == after
        assert final.output_bytes == len(before) + len(after)
        await session.end()
    # The supervisor closed cleanly; its store is readable again.
    async with Supervisor(
        state_dir=small_volume / "state", policies_dir=policies_dir, min_free_bytes=4 << 20
    ) as sup2:
        assert sup2.instance_id == sup.instance_id

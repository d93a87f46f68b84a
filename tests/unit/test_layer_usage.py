"""``layer_usage``: what an overlay upper takes on the host disk, for the workspace cap."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.state.workspace.usage import layer_usage


def test_bytes_are_allocated_blocks_and_every_entry_counts(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "data").write_bytes(os.urandom(100_000))
    (tmp_path / "empty").touch()
    os.symlink("/etc", tmp_path / "link")
    usage = layer_usage(tmp_path)
    blocks = sum(
        os.lstat(p).st_blocks * 512
        for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "data")
    )
    assert (usage.files, usage.complete, usage.unreadable) == (5, True, 0)
    assert usage.bytes == blocks + os.lstat(tmp_path / "link").st_blocks * 512


def test_a_link_is_not_followed_and_a_hard_link_counts_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(1 << 20))
    upper = tmp_path / "upper"
    upper.mkdir()
    os.symlink(outside, upper / "to-outside")
    (upper / "one").write_bytes(os.urandom(200_000))
    os.link(upper / "one", upper / "two")
    usage = layer_usage(upper)
    assert usage.files == 3
    assert usage.bytes < 300_000, usage


def test_the_walk_stops_once_past_a_limit(tmp_path: Path) -> None:
    for i in range(100):
        (tmp_path / f"f{i}").touch()
    usage = layer_usage(tmp_path, stop_files=10)
    assert (usage.files, usage.complete) == (11, False)
    assert usage.over(1 << 30, 10)
    (tmp_path / "big").write_bytes(os.urandom(1 << 20))
    assert not layer_usage(tmp_path, stop_bytes=1 << 19).complete


def test_a_deep_tree_holds_one_handle_per_level(tmp_path: Path) -> None:
    path = tmp_path
    for _ in range(300):
        path = path / "d"
        path.mkdir()
    wide = tmp_path / "wide"
    wide.mkdir()
    for i in range(2000):
        (wide / f"sub{i}").mkdir()
    before = len(os.listdir("/proc/self/fd"))
    usage = layer_usage(tmp_path)
    assert (usage.files, usage.complete) == (300 + 1 + 2000, True)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_missing_upper_holds_nothing(tmp_path: Path) -> None:
    usage = layer_usage(tmp_path / "gone")
    assert (usage.bytes, usage.files, usage.complete) == (0, 0, True)

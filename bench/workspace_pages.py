"""workspace pages: what ``GET .../workspace/changes`` costs on a big upper, the whole listing
(what the route answered before it paged: every change hashed and encoded) against its first
page (1000 changes) and against reading every page in turn (10 000 each, cut from one walk).

No engine, no daemon: the state layer's calls the route makes, in this process, on an upper
built directly on disk (small new files, 100 to a directory). Run it on a tree of an older
checkout too (``PYTHONPATH=<old checkout>``): the whole listing is measured there as well,
the pages only where the code has them.

    python -m bench.workspace_pages --files 200000 --dir /tmp/pages-bench/n200k --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.workspace import _tree
from supervisor.state import workspace as ws


def build(base: Path, n: int) -> None:
    """A lower of two files and an upper of ``n`` new ~200-byte files, with the manifest."""
    lower, upper = base / "lower", base / "upper"
    lower.mkdir(parents=True)
    (lower / "README.md").write_text("project\n")
    (lower / ".gitignore").write_text("*.log\nbuild/\n")
    _tree(upper, n)
    ws.Manifest.take(lower).save(base / "manifest")


def whole(lower: Path, upper: Path, manifest: ws.Manifest) -> tuple[int, int]:
    """The route before paging: every change hashed, the visible ones encoded."""
    found = ws.list_changes(lower, upper, manifest)
    body = json.dumps([c.to_dict() for c in found if not c.ignored]).encode()
    return len(found), len(body)


def first_page(lower: Path, upper: Path, manifest: ws.Manifest) -> tuple[int, int]:
    """The route now, without ``after``: one walk, 1000 changes hashed and encoded."""
    page = ws.page_of(upper, ws.classify(lower, upper, manifest), limit=1000, ignored=False)
    return page.total, len(json.dumps(page.to_dict()).encode())


def every_page(lower: Path, upper: Path, manifest: ws.Manifest) -> tuple[int, int]:
    """What the CLI's listing (and an apply's review) asks for: pages of 10 000 cut from one
    walk, until the last."""
    listing = ws.classify(lower, upper, manifest)
    after, listed, size = None, 0, 0
    while True:
        page = ws.page_of(upper, listing, limit=10_000, after=after, ignored=False)
        listed += len(page.changes)
        size += len(json.dumps(page.to_dict()).encode())
        if page.next is None:
            return listed, size
        after = page.next


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.workspace_pages", description=__doc__)
    p.add_argument("--files", type=int, default=200_000, help="new files in the upper")
    p.add_argument("--dir", type=Path, required=True, help="where the tree is (built once)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if not (args.dir / "manifest").exists():
        print(f"building an upper of {args.files} new files in {args.dir}")
        build(args.dir, args.files)
    lower, upper = args.dir / "lower", args.dir / "upper"
    manifest = ws.Manifest.load(args.dir / "manifest")
    cases: dict[str, Callable[[Path, Path, ws.Manifest], tuple[int, int]]] = {
        "whole listing (before paging)": whole
    }
    if hasattr(ws, "page_of"):
        cases["first page, limit 1000"] = first_page
        cases["every page, limit 10000, one walk"] = every_page
    times: dict[str, list[float]] = {name: [] for name in cases}
    sizes: dict[str, tuple[int, int]] = {}
    for _ in range(args.rounds):  # interleaved, so a load change hits every case alike
        for name, fn in cases.items():
            t0 = time.perf_counter()
            sizes[name] = fn(lower, upper, manifest)
            times[name].append(time.perf_counter() - t0)
    print(f"{'case':<36} {'p50 s':>7} {'min s':>7} {'changes':>9} {'JSON bytes':>12}")
    for name in cases:
        count, size = sizes[name]
        t = times[name]
        print(f"{name:<36} {statistics.median(t):7.2f} {min(t):7.2f} {count:9,} {size:12,}")


if __name__ == "__main__":
    main()

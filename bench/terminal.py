"""terminal: characters handed to the agent before and after rendering (issue 25), for each
item of the captured corpus (tests/data/terminal), and what rendering costs per MB.

Pure CPU, no engine: ``python -m bench.run terminal`` or ``python -m bench.terminal`` (prints
the README's table). Capture never renders (the output file stays raw); this cost is paid
on reads: a tool result, a poll's tail, a notification.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench.common import Ctx, Result, row
from supervisor.core.terminal import render

NAME = "terminal"
TITLE = "characters the agent reads, raw vs rendered, and render cost per MB"
CORPUS = Path(__file__).parents[1] / "tests" / "data" / "terminal"
#: Mostly a progress display: the rendering must be at least 5x smaller.
PROGRESS = ("buildkit-redraw", "curl-progress", "npm-install", "pip-progress", "tqdm-loop")


def sizes() -> list[tuple[str, int, int]]:
    """(item, characters before, characters after) for each corpus item."""
    out = []
    for raw in sorted(CORPUS.glob("*.raw")):
        data = raw.read_bytes()
        out.append((raw.stem, len(data.decode("utf-8", "replace")), len(render(data).text)))
    return out


def cost(megabytes: int = 8, rounds: int = 3) -> dict[str, float]:
    """Milliseconds per MB to render the whole corpus repeated to ``megabytes`` MB, and
    plain text lines (a build log without escapes) for comparison; best of ``rounds``."""
    corpus = b"".join(p.read_bytes() for p in sorted(CORPUS.glob("*.raw")))
    mixed = (corpus * (megabytes * (1 << 20) // len(corpus) + 1))[: megabytes << 20]
    plain = b"".join(b"compiling module %06d ... ok\n" % i for i in range(400_000))
    plain = (plain * (megabytes * (1 << 20) // len(plain) + 1))[: megabytes << 20]
    found: dict[str, float] = {}
    for label, data in (("corpus", mixed), ("plain", plain)):
        best = float("inf")
        for _ in range(rounds):
            t0 = time.perf_counter()
            render(data)
            best = min(best, time.perf_counter() - t0)
        found[label] = best * 1000 / megabytes
    return found


async def run(ctx: Ctx) -> Result:
    res = Result(NAME, TITLE, percentiles=("p50",))
    items = await asyncio.to_thread(sizes)
    for name, before, after in items:
        progress = name in PROGRESS
        res.rows.append(
            row(
                f"chars handed to the agent: {name}",
                "chars",
                after,
                baseline="raw",
                base=before,
                target="<= raw / 5" if progress else "",
                passed=after * 5 <= before if progress else None,
            )
        )
    per_mb = await asyncio.to_thread(cost, 1 if ctx.quick else 8)
    res.rows.append(row("render cost, the corpus repeated", "ms/MB", per_mb["corpus"]))
    res.rows.append(row("render cost, plain log lines", "ms/MB", per_mb["plain"]))
    res.samples = {"items": items, "ms_per_mb": per_mb}
    res.notes.append(
        "Characters: the raw output decoded as before issue 25 vs core.terminal's rendering "
        "(what the MCP tools and notifications hand the agent). Cost: render() of the whole "
        "input in one call, one core, best of 3."
    )
    return res


def main() -> None:
    print("| corpus item | raw chars | rendered chars | smaller by |")
    print("|---|---:|---:|---:|")
    for name, before, after in sizes():
        print(f"| {name} | {before:,} | {after:,} | {before / max(after, 1):.1f}x |")
    per_mb = cost()
    print(
        f"\nrender cost: {per_mb['corpus']:.0f} ms per MB of the corpus repeated, "
        f"{per_mb['plain']:.0f} ms per MB of plain log lines (one core)"
    )


if __name__ == "__main__":
    main()

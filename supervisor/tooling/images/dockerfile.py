"""Reading an image's Dockerfile: its base, its instructions, its config as import changes."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor.tooling.images.catalogue import ImageBuildError

#: The instructions that set image config (not filesystem content): the ones ``docker
#: import --change`` accepts, so an imported root filesystem gets the Dockerfile's config.
_IMPORT_INSTRUCTIONS = frozenset({"ENV", "LABEL", "WORKDIR", "USER", "CMD", "ENTRYPOINT"})


def dockerfile_base(dockerfile: Path) -> str:
    """The image of the Dockerfile's first ``FROM``."""
    for instr, args in dockerfile_instructions(dockerfile.read_text(encoding="utf-8")):
        if instr == "FROM":
            return args.split()[0]
    raise ImageBuildError(f"{dockerfile} has no FROM line")


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, with continuation lines joined and comments gone."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            instr, _, args = full.partition(" ")
            out.append((instr.upper(), args.strip()))
    if pending.strip():
        instr, _, args = pending.strip().partition(" ")
        out.append((instr.upper(), args.strip()))
    return out


def import_changes(dockerfile_text: str, labels: dict[str, str]) -> list[str]:
    """``docker import --change`` lines: the Dockerfile's image config, plus our labels."""
    changes = [
        f"{i} {a}" for i, a in dockerfile_instructions(dockerfile_text) if i in _IMPORT_INSTRUCTIONS
    ]
    changes.extend(f"LABEL {k}={json.dumps(v)}" for k, v in sorted(labels.items()))
    return changes

"""Build progress: the reports a build emits, and debootstrap's output turned into steps."""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from supervisor.tooling.images.catalogue import LABEL_IMAGE, LABEL_SOURCE_HASH, repository


@dataclass(frozen=True, slots=True)
class BuildProgress:
    """One progress report of a build: a new ``step`` or finer ``detail`` within it."""

    image: str
    """Image name."""
    step: str
    """What the build is doing (``docker build: step 3/8 RUN ...``, ``debootstrap: unpacking``)."""
    detail: str
    """Finer progress within the step (a package count, an output line); may be empty."""
    elapsed_s: float
    """Seconds since this image's build started."""


Progress = Callable[[BuildProgress], None]


@dataclass
class Build:
    """Everything one build needs, plus the step it is in (for progress reports)."""

    client: Any
    name: str
    directory: Path
    source_hash: str
    force: bool
    pull: bool
    progress: Progress | None
    started: float
    step: str = "start"

    @property
    def repo(self) -> str:
        return repository(self.name)

    @property
    def tag(self) -> str:
        return f"{self.repo}:{self.source_hash}"

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_IMAGE: self.name, LABEL_SOURCE_HASH: self.source_hash}

    def report(self, step: str, detail: str = "") -> None:
        self.step = step
        if self.progress is not None:
            self.progress(BuildProgress(self.name, step, detail, time.monotonic() - self.started))

    def detail(self, text: str) -> None:
        self.report(self.step, text)


class DebootstrapProgress:
    """Turns debootstrap's ``I:`` lines into ``(step, detail)`` with package counts.

    Steps are debootstrap's phases; lines that name no phase are details of the current one.
    """

    _PHASES: ClassVar[dict[str, str]] = {
        "Retrieving": "retrieving",
        "Validating": "retrieving",
        "Extracting": "extracting",
        "Unpacking": "unpacking",
        "Configuring": "configuring",
    }
    _INDEXES: ClassVar[tuple[str, ...]] = ("InRelease", "Release", "Packages")
    _GROUPS: ClassVar[tuple[str, ...]] = ("required packages", "the base system", "base packages")

    def __init__(self) -> None:
        self.total = 0
        """Packages retrieved: the denominator of the later phases."""
        self.step = "debootstrap: preparing"
        self._seen: dict[str, set[str]] = collections.defaultdict(set)

    def feed(self, line: str) -> tuple[str, str] | None:
        """The step and detail a line of output stands for, or None for noise."""
        text = line.strip()
        # W: and E: lines are not progress; they reach the user in the error when it fails.
        if not text.startswith("I: "):
            return None
        body = text[3:].strip()
        verb, _, rest = body.partition(" ")
        package = rest.split(" ", 1)[0].removesuffix("...").split(":", 1)[0]
        phase = self._PHASES.get(verb)
        if phase is None or package in self._INDEXES:
            return self._note(body)
        group = rest.removesuffix("...")
        if group in self._GROUPS:
            # debootstrap unpacks and configures twice (required, then base): name which.
            self.step = f"debootstrap: {phase} {group}"
            return (self.step, "")
        if not self.step.startswith(f"debootstrap: {phase}"):
            self.step = f"debootstrap: {phase}"
        return (self.step, self._count(phase, package))

    def _note(self, body: str) -> tuple[str, str]:
        """A line that names no package: the end of the bootstrap, or a detail of the step."""
        if body.startswith("Base system installed"):
            self.step = "debootstrap: done"
            return (self.step, "")
        return (self.step, body)

    def _count(self, phase: str, package: str) -> str:
        """``n package`` while retrieving, ``n/total package`` in the later phases."""
        if not package:
            return ""
        seen = self._seen[phase]
        seen.add(package)
        if phase == "retrieving":
            self.total = len(seen)
            return f"{len(seen)} {package}"
        return f"{len(seen)}/{max(self.total, len(seen))} {package}"


class AptProgress:
    """Turns ``apt-get install`` output into ``(step, detail)`` with package counts."""

    _VERBS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("Unpacking ", "unpacking"),
        ("Setting up ", "configuring"),
    )

    def __init__(self) -> None:
        self.total = 0
        """Packages apt will install (its ``N newly installed``)."""
        self._seen: dict[str, set[str]] = collections.defaultdict(set)

    def feed(self, line: str) -> tuple[str, str] | None:
        """The step and detail a line of output stands for, or None for noise."""
        text = line.strip()
        match = re.match(r"^\d+ upgraded, (\d+) newly installed", text)
        if match:
            self.total = int(match.group(1))
            return ("apt-get: resolving", f"{self.total} packages to install")
        phase, package = self._phase(text)
        if phase is None:
            return None
        seen = self._seen[phase]
        seen.add(package)
        return (f"apt-get: {phase}", f"{len(seen)}/{max(self.total, len(seen))} {package}")

    def _phase(self, text: str) -> tuple[str | None, str]:
        if text.startswith("Get:"):
            # Get:12 http://mirror/debian bookworm/main amd64 libc6 amd64 2.36-9 [2757 kB]
            fields = text.split()
            return ("downloading", fields[4]) if len(fields) > 4 else (None, "")
        for verb, phase in self._VERBS:
            if text.startswith(verb):
                return (phase, text[len(verb) :].split(" ", 1)[0].split(":", 1)[0])
        return (None, "")

"""The shape of ``sandvisor doctor``'s checks (shared by the engine and Swarm node checks)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


CheckStatus = Literal["ok", "warn", "fail"]


class Check(_Model):
    """The outcome of one readiness check."""

    name: str
    """``engine``, ``runtime runc``, ``runtime runsc``, ``image <name>``, ``state dir``,
    ``policies``."""
    status: CheckStatus
    """``ok``; ``warn``: works, with a caveat; ``fail``: the supervisor cannot run tasks."""
    detail: str
    """One line for people: what was found, and what to do when it is not ok."""
    facts: dict[str, Any] = Field(default_factory=dict)
    """What was measured, for machines (versions, ids, booleans)."""
    fix: str | None = None
    """The one command that fixes it, when there is one (``sandvisor images build dev``)."""

"""Validation messages, formatted in one place: each bad field named, with what is allowed.

Built on :func:`supervisor.core.problems.field_problems` (which the daemon uses for request
bodies too); this adds what a task spec's errors say (the allowed fields, the bad value)."""

from __future__ import annotations

from pydantic import ValidationError

from supervisor.core.errors import SpecError
from supervisor.core.models import TaskSpec
from supervisor.core.problems import field_problems

#: Longest message part for one field (a huge bad value is cut, not echoed whole).
_PART_MAX = 300


def spec_error(exc: ValidationError) -> SpecError:
    """A TaskSpec validation error as one SpecError naming each bad field (and the field
    itself when there is only one)."""
    allowed = ", ".join(sorted(TaskSpec.model_fields))
    parts: list[tuple[str, str]] = []
    for p in field_problems(exc.errors(), drop=()):
        if p.kind == "extra_forbidden":
            message = f"unknown field (allowed: {allowed})"
        elif p.value is not None and not isinstance(p.value, dict):
            message = f"{p.message} (got {p.value!r})"
        else:
            message = p.message
        parts.append((p.field or "spec", message[:_PART_MAX]))
    if len(parts) == 1:
        return SpecError(parts[0][1], field=parts[0][0])
    return SpecError("; ".join(f"{field}: {message}" for field, message in parts))

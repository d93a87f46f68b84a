"""Validation messages, formatted in one place: each bad field named, with what is allowed."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import ValidationError

from supervisor.core.errors import SpecError
from supervisor.core.models import TaskSpec

#: Longest message part for one field (a huge bad value is cut, not echoed whole).
_PART_MAX = 300


def field_problems(exc: ValidationError, allowed: Iterable[str] = ()) -> list[tuple[str, str]]:
    """(field, message) for each error; an unknown field's message lists ``allowed``."""
    names = ", ".join(sorted(allowed))
    out: list[tuple[str, str]] = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "extra_forbidden":
            message = f"unknown field (allowed: {names})" if names else "unknown field"
        elif err["type"] == "json_invalid":
            loc, message = "body", str(err["msg"])
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            if "input" in err and not isinstance(err["input"], dict):
                message = f"{message} (got {err['input']!r})"
        out.append((loc, message[:_PART_MAX]))
    return out


def spec_error(exc: ValidationError) -> SpecError:
    """A TaskSpec validation error as one SpecError naming each bad field."""
    parts = field_problems(exc, TaskSpec.model_fields)
    return SpecError("; ".join(f"{field}: {message}" for field, message in parts))

"""Invalid fields, named for people: pydantic's validation errors as (field, problem) pairs,
and ``InvalidRequest`` (HTTP 422) carrying them. No pydantic import: the CLI loads this."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.core.errors import SpecError


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One invalid field of a request or spec, from a pydantic error."""

    field: str
    """Dotted location (``env.PATH``); empty for the object as a whole."""
    message: str
    """What is wrong, without pydantic's ``Value error, `` prefix."""
    kind: str
    """pydantic's error type (``extra_forbidden``, ``less_than_equal``, ...)."""
    value: Any = None
    """The input that was refused."""


def field_problems(
    errors: Iterable[Mapping[str, Any]], *, drop: tuple[str, ...] = ("body",)
) -> list[FieldProblem]:
    """pydantic's ``ValidationError.errors()`` as named problems, worded for people:
    ``env.A``, ``query.limit``, ``header.Last-Event-ID``. ``drop``: a leading location part
    that names the container (a JSON body's fields are named as they are in the body).
    Unknown fields read ``unknown field``; our validators' ``Value error, `` prefix goes."""
    problems = []
    for err in errors:
        kind = str(err.get("type", ""))
        loc = [str(p) for p in err.get("loc", ())]
        if loc and loc[0] in drop:
            loc = loc[1:]
        if len(loc) >= 2 and loc[0] == "header":
            loc[1] = "-".join(
                w.upper() if w.lower() == "id" else w.title() for w in loc[1].split("-")
            )
        message = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if kind == "extra_forbidden":
            message = "unknown field"
        elif kind == "json_invalid":
            loc = []  # its location is a character position, not a field
            ctx = err.get("ctx") or {}
            message = f"not valid JSON ({ctx['error']})" if "error" in ctx else "not valid JSON"
        problems.append(FieldProblem(".".join(loc), message, kind, err.get("input")))
    return problems


class InvalidRequest(SpecError):
    """The request is malformed: a field has the wrong type or range, the body is not JSON.
    ``fields`` names each bad field (``[{"field", "message"}]``)."""

    code = "invalid_request"

    def __init__(
        self,
        problem: str | Sequence[tuple[str, str]],
        *,
        field: str | None = None,
        fields: list[dict[str, str]] | None = None,
    ) -> None:
        if not isinstance(problem, str):  # (field, what is wrong) pairs
            fields = [{"field": name, "message": why} for name, why in problem]
            problem = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
        super().__init__(problem, field=field)
        self.fields = list(fields or [])

    @classmethod
    def from_errors(cls, errors: Iterable[Mapping[str, Any]]) -> InvalidRequest:
        """From pydantic's ``ValidationError.errors()`` (or FastAPI's request errors)."""
        return cls.from_problems(field_problems(errors))

    @classmethod
    def from_problems(cls, problems: Iterable[FieldProblem]) -> InvalidRequest:
        """One message naming every problem (``body`` for the request as a whole)."""
        fields = [{"field": p.field or "body", "message": p.message} for p in problems]
        return cls("; ".join(f"{f['field']}: {f['message']}" for f in fields), fields=fields)

    @classmethod
    def _rebuild(cls, message: str, detail: Mapping[str, Any], known: Mapping[str, str]) -> Any:
        raw = detail.get("fields")
        fields = [
            {"field": str(f.get("field", "")), "message": str(f.get("message", ""))}
            for f in (raw if isinstance(raw, list) else [])
            if isinstance(f, Mapping)
        ]
        return cls(message, fields=fields)

    def wire_detail(self) -> dict[str, Any]:
        return {**super().wire_detail(), **({"fields": self.fields} if self.fields else {})}

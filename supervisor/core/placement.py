"""Placement constraints (Swarm's syntax): parsed and checked here, matched against a node's
attributes, so a policy names only nodes that exist and a backend can tell at once that no
node can take a task (fail closed) instead of leaving it pending forever."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

#: What a constraint may look at: Swarm's node attributes (docs: "Specify service
#: constraints"); ``node.labels.*`` are the operator's, ``engine.labels.*`` the daemon's.
_KEY = re.compile(
    r"^(node\.(id|hostname|role|platform\.os|platform\.arch|labels\.[A-Za-z0-9_.-]+)"
    r"|engine\.labels\.[A-Za-z0-9_.-]+)$"
)
_VALUE = re.compile(r"^[A-Za-z0-9_.:/@+-]+$")


@dataclass(frozen=True)
class Constraint:
    """One ``key==value`` or ``key!=value``."""

    key: str
    op: Literal["==", "!="]
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"

    def matches(self, attrs: dict[str, str]) -> bool:
        """Whether a node with these attributes satisfies it (a missing attribute equals
        nothing, so ``!=`` holds for it, as in Swarm). Names compare case-insensitively,
        as Swarm's do; label values exactly."""
        have = attrs.get(self.key)
        if have is not None and not self.key.startswith(("node.labels.", "engine.labels.")):
            equal = have.lower() == self.value.lower()
        else:
            equal = have == self.value
        return equal if self.op == "==" else not equal


def parse_constraint(text: str) -> Constraint:
    """``node.labels.sandbox==gvisor`` → Constraint; ValueError naming what is wrong."""
    for op in ("==", "!="):
        key, sep, value = text.partition(op)
        if sep:
            key, value = key.strip(), value.strip()
            break
    else:
        raise ValueError(f"placement {text!r}: expected KEY==VALUE or KEY!=VALUE")
    if not _KEY.match(key):
        raise ValueError(
            f"placement {text!r}: unknown key {key!r} (allowed: node.id, node.hostname, "
            "node.role, node.platform.os, node.platform.arch, node.labels.<name>, "
            "engine.labels.<name>)"
        )
    if not _VALUE.match(value):
        raise ValueError(f"placement {text!r}: the value must be a plain word, got {value!r}")
    return Constraint(key=key, op="==" if op == "==" else "!=", value=value)


def matches_all(constraints: list[Constraint], attrs: dict[str, str]) -> bool:
    """Whether a node satisfies every constraint (Swarm ANDs them)."""
    return all(c.matches(attrs) for c in constraints)

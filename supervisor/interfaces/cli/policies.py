"""``sandvisor policies``: list the policies a supervisor would load, and show one in full."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.core.errors import PolicyError
from supervisor.interfaces.cli.common import HelpFormatter, fail, print_json, print_table

if TYPE_CHECKING:
    from supervisor.core.policy import Policy, PolicySet

POLICIES_EPILOG = """\
A policy is a named, validated set of isolation settings and limits, one file per policy
(policies/<name>.toml). Tasks name theirs with `policy` (default: "default").

examples:
  sandvisor policies list                        name, runtime, network, image, description
  sandvisor policies show untrusted              every effective value, defaults filled in
  sandvisor policies list --policies-dir ./my-policies
"""

LIST_EPILOG = """\
A malformed policy file is an error (exit status 1) that names the file, the key, the
value and what is allowed: a supervisor would refuse to start with it.

examples:
  sandvisor policies list
  sandvisor policies list --json | jq -r '.[] | select(.runtime == "runsc") | .name'
  SANDVISOR_POLICIES_DIR=/etc/sandvisor/policies sandvisor policies list
"""

SHOW_EPILOG = """\
Prints every setting the policy's tasks run with, the built-in defaults filled in for
the keys its file leaves out. The text form is valid TOML: saved as <name>.toml it is an
equivalent policy file. Keys that are not set (e.g. no idle timeout) appear as comments.

examples:
  sandvisor policies show default
  sandvisor policies show ci --json | jq .limits
  sandvisor policies show untrusted > policies/mine.toml   # then edit name and values
"""


def _load(args: argparse.Namespace) -> PolicySet:
    # Here, not at the top: `sandvisor --help` and the other commands need no policy models.
    from supervisor.core.policy import PolicySet  # noqa: PLC0415

    directory: Path | None = args.policies_dir
    return PolicySet.load(directory)


def _summary(policy: Policy) -> dict[str, Any]:
    return {
        "name": policy.name,
        "runtime": policy.runtime,
        "network": policy.network,
        "image": policy.image,
        "description": policy.description,
    }


def _list(args: argparse.Namespace) -> int:
    try:
        policies = _load(args)
    except PolicyError as exc:
        return fail(str(exc))
    rows = [_summary(p) for p in policies.all()]
    if args.json:
        print_json(rows)
        return 0
    headers = ["name", "runtime", "network", "image", "description"]
    print_table(headers, [[r[h] for h in headers] for r in rows])
    return 0


def _show(args: argparse.Namespace) -> int:
    try:
        policy = _load(args).get(args.name)
    except PolicyError as exc:
        return fail(str(exc))
    data = policy.model_dump(mode="json")
    if args.json:
        print_json(data)
        return 0
    sys.stdout.write(f"# policy {policy.name!r}: every effective value (defaults filled in)\n")
    sys.stdout.write(to_toml(data))
    return 0


def _scalar(value: Any) -> str:
    """A TOML literal. ``json.dumps`` strings are valid TOML basic strings: it emits only
    the escapes TOML also has (``\\"``, ``\\\\``, ``\\n``, ``\\uXXXX``, ...)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_scalar(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _key(name: str) -> str:
    bare = name.replace("_", "").replace("-", "").isalnum() and name.isascii()
    return name if bare else json.dumps(name)


def _body(table: dict[str, Any]) -> list[str]:
    """``key = value`` lines of one table; None becomes a comment (TOML has no null)."""
    lines = []
    for key, value in table.items():
        if value is None:
            lines.append(f"# {_key(key)}: not set")
        else:
            lines.append(f"{_key(key)} = {_scalar(value)}")
    return lines


def to_toml(data: dict[str, Any]) -> str:
    """Render a policy dump as TOML: scalars first, then ``[table]``s and ``[[array]]``s."""
    top = {
        k: v
        for k, v in data.items()
        if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))
    }
    lines = _body(top)
    for key, value in data.items():
        if isinstance(value, dict):
            lines += ["", f"[{_key(key)}]", *_body(value)]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                lines += ["", f"[[{_key(key)}]]", *_body(item)]
    return "\n".join(lines) + "\n"


def _add_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policies-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder of <name>.toml policy files that override or add to the shipped ones "
        "(default: $SANDVISOR_POLICIES_DIR, else the shipped policies alone)",
    )


def register(subparsers: Any) -> None:
    """Add ``sandvisor policies list`` and ``sandvisor policies show NAME``."""
    parser = subparsers.add_parser(
        "policies",
        help="list the policies and show their effective settings",
        description="List the policies tasks can run under, and show one policy's settings.",
        epilog=POLICIES_EPILOG,
        formatter_class=HelpFormatter,
    )

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)
    subs = parser.add_subparsers(dest="policies_command", metavar="SUBCOMMAND")

    listing = subs.add_parser(
        "list",
        help="name, runtime, network, image and description of every policy",
        description="List every policy in the policies folder (invalid files are an error).",
        epilog=LIST_EPILOG,
        formatter_class=HelpFormatter,
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    _add_dir_option(listing)
    listing.set_defaults(func=_list)

    show = subs.add_parser(
        "show",
        help="every effective setting of one policy, defaults filled in",
        description="Show every setting the policy's tasks run with.",
        epilog=SHOW_EPILOG,
        formatter_class=HelpFormatter,
    )
    show.add_argument("name", metavar="NAME", help="policy name (see `sandvisor policies list`)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    _add_dir_option(show)
    show.set_defaults(func=_show)

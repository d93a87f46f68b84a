"""What is known about Docker engine versions: the libnetwork deadlocks of 20.10 and older
(what doctor warns about and the dashboard's engine banner repeats)."""

from __future__ import annotations

#: What is said about a Docker 20.10 (or older) engine (what engine.sh does about it).
DEADLOCK_NOTE = (
    "known libnetwork deadlocks exist in this engine (moby #46661, #44682): creating and "
    "removing containers at once can wedge it until it is restarted (`sandvisor doctor "
    "--fix-engine` restarts the one `make engine` started); newer engines fix them: on "
    "Debian 12, `make engine` installs Debian 13's docker.io 26.1 when it starts an engine "
    "(it never replaces a running one, so stop its own first: `make engine-down && make "
    "engine`; SANDVISOR_KEEP_ENGINE=1 keeps 20.10), or install docker-ce from Docker's own "
    "repository; see the README"
)


def deadlock_prone(version: str) -> bool:
    """Whether an engine of this version has the libnetwork deadlocks of 20.10 (it, or older:
    both past their end of life). Unparsable versions are given the benefit of the doubt."""
    parts = version.split("+", 1)[0].split("-", 1)[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return False
    return (major, minor) <= (20, 10)

"""The host's Debian mirror, read from its apt sources, for debootstrap."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

DEBIAN_SUITE = "bookworm"
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"

_DEBIAN_CODENAMES = frozenset(
    {"buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid"}
    | {"oldoldstable", "oldstable", "stable", "testing", "unstable"}
)


@dataclass(frozen=True, slots=True)
class AptSource:
    """One ``deb`` source: where, which suites, which components."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...] = ()


def parse_sources_list(text: str) -> list[AptSource]:
    """``deb [options] URI suite component...`` lines of a one-line-style sources.list."""
    out: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line)
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "deb":
            out.append(AptSource(uri=parts[1], suites=(parts[2],), components=tuple(parts[3:])))
    return out


def parse_deb822(text: str) -> list[AptSource]:
    """Stanzas of a deb822 ``*.sources`` file with ``Types: deb`` and not ``Enabled: no``."""
    out: list[AptSource] = []
    for stanza in _deb822_stanzas(text):
        if "deb" not in stanza.get("types", "").split():
            continue
        if stanza.get("enabled", "yes").strip().lower() == "no":
            continue
        suites = tuple(stanza.get("suites", "").split())
        components = tuple(stanza.get("components", "").split())
        out.extend(
            AptSource(uri=uri, suites=suites, components=components)
            for uri in stanza.get("uris", "").split()
        )
    return out


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    fields: dict[str, str] = {}
    key: str | None = None
    for raw in [*text.splitlines(), ""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                yield fields
            fields, key = {}, None
            continue
        if raw[0] in " \t" and key is not None:
            fields[key] += " " + raw.strip()
            continue
        name, sep, value = raw.partition(":")
        if sep:
            key = name.strip().lower()
            fields[key] = value.strip()


def pick_debian_mirror(sources: Sequence[AptSource], suite: str = DEBIAN_SUITE) -> str | None:
    """The archive that serves ``suite``: one listing it, else one listing another codename."""
    # Vendor repositories (Docker's lists "bookworm stable") have no Debian "main" component.
    usable = [
        s
        for s in sources
        if s.uri.split(":", 1)[0] in ("http", "https", "file")
        and (not s.components or "main" in s.components)
    ]
    for src in usable:
        if suite in src.suites:
            return src.uri.rstrip("/")
    # A host on another release still points at a full Debian archive, which serves every
    # suite; -security and -updates archives do not, and neither do Ubuntu's.
    for src in usable:
        if any(s in _DEBIAN_CODENAMES for s in src.suites):
            return src.uri.rstrip("/")
    return None


def host_debian_mirror(*, etc_apt: Path = Path("/etc/apt"), suite: str = DEBIAN_SUITE) -> str:
    """``$SANDVISOR_DEBIAN_MIRROR``, else the host's apt mirror for ``suite``.

    Else deb.debian.org.
    """
    env = os.environ.get("SANDVISOR_DEBIAN_MIRROR")
    if env:
        return env.rstrip("/")
    sources: list[AptSource] = []
    with contextlib.suppress(OSError):
        sources.extend(parse_sources_list((etc_apt / "sources.list").read_text()))
    list_d = etc_apt / "sources.list.d"
    with contextlib.suppress(OSError):
        for path in sorted(list_d.iterdir()):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                if path.name.endswith(".sources"):
                    sources.extend(parse_deb822(path.read_text()))
                elif path.name.endswith(".list"):
                    sources.extend(parse_sources_list(path.read_text()))
    return pick_debian_mirror(sources, suite) or DEFAULT_DEBIAN_MIRROR

"""core.visible: the one rule for showing text a task chose (controls, bidi, invisible
format characters) as visible escapes."""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

import pytest

from supervisor.core.visible import UNSAFE_CLASS, escape_char, has_unsafe, quote_name, visible

JOINERS = {"\u200c", "\u200d"}
ANSI_JS = Path(__file__).resolve().parents[2] / "supervisor/interfaces/daemon/ui/ansi.js"


def test_escapes() -> None:
    assert visible("a\x1b[2Kb") == "a\\x1b[2Kb"
    assert visible("\x00\x07\x7f\x9b") == "\\x00\\x07\\x7f\\x9b"
    assert visible("\u202eabc\u202c") == "\\u202eabc\\u202c"
    assert visible("\U000e0041") == "\\U000e0041"
    assert visible("\t\n\r") == "\\x09\\x0a\\x0d"
    assert visible("\t\n\r", keep="\t\n") == "\t\n\\x0d"
    assert visible("plain é ü 漢字 🙂") == "plain é ü 漢字 🙂"
    assert escape_char("\u2028") == "\\u2028"
    assert has_unsafe("x\u200by") and not has_unsafe("xy") and not has_unsafe("\n", keep="\n")
    with pytest.raises(ValueError, match="C0"):
        visible("x", keep="a")


@pytest.mark.parametrize(
    "ch",
    [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0xFFFE, 0xFFFF, 0xD800)],
)
def test_controls_separators_and_non_characters(ch: str) -> None:
    assert visible(ch) == escape_char(ch)


def test_every_format_character_but_the_joiners() -> None:
    """Category Cf of this Python's Unicode database is covered (the list is by range)."""
    missed = [
        f"U+{c:04X}"
        for c in range(sys.maxunicode + 1)
        if unicodedata.category(chr(c)) == "Cf"
        and chr(c) not in JOINERS
        and visible(chr(c)) == chr(c)
    ]
    assert missed == []
    assert all(visible(j) == j for j in JOINERS)


def test_the_dashboard_uses_the_same_set() -> None:
    """ui/ansi.js escapes the same characters but tab and newline (its own regex: it runs
    in the browser)."""
    found = re.search(r"^const UNSAFE = /\[(.*)\]/gu;$", ANSI_JS.read_text(), re.M)
    assert found, "ansi.js: const UNSAFE = /[...]/gu; not found"
    # JS spells astral code points \u{...}, Python \U........; the rest is the same syntax.
    js_class = re.sub(r"\\u\{([0-9a-f]+)\}", lambda m: f"\\U{int(m.group(1), 16):08x}", found[1])
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    in_js = set(re.findall(f"[{js_class}]", every))
    in_core = set(re.findall(f"[{UNSAFE_CLASS}]", every)) - {"\t", "\n"}
    assert sorted(in_js ^ in_core) == []


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("src/main.py", "src/main.py"),
        ("caf\u00e9 \u6f22\u5b57.txt", "caf\u00e9 \u6f22\u5b57.txt"),  # printable: as is
        ("clip\x1b]52;c;eA==\x07.txt", '"clip\\x1b]52;c;eA==\\x07.txt"'),
        ("tab\tnew\nline", '"tab\\x09new\\x0aline"'),
        ("a\u202etxt.exe", '"a\\u202etxt.exe"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\x1b", '"back\\\\x1b"'),  # a literal backslash cannot pass for an escape
        ("bad\udcff", '"bad\\xff"'),  # an undecodable byte (surrogateescape) as that byte
    ],
)
def test_quote_name_as_git_does(name: str, shown: str) -> None:
    assert quote_name(name) == shown

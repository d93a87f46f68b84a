"""The pure-Python gitignore matcher against ``git check-ignore --no-index`` itself: a corpus
of tricky patterns and hypothesis-made ones, root and nested files, files and directories."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from supervisor.state.workspace import gitcmd
from supervisor.state.workspace.gitignore import Matcher, parse, translate
from tests.conftest import examples

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git to compare with")


def git_ignored(
    repo: Path, queries: list[tuple[str, bool]]
) -> tuple[set[tuple[str, bool]], set[tuple[str, bool]]]:
    """What git itself says (directories asked with a trailing slash): (ignored, unsure).
    Unsure: a directory matched only as ``dir/`` by a blank pattern (see gitcmd)."""
    data = b"".join(b"./" + os.fsencode(p) + (b"/" if d else b"") + b"\0" for p, d in queries)
    proc = subprocess.run(
        [
            "git",
            "-c",
            "core.excludesFile=/dev/null",
            "check-ignore",
            "--stdin",
            "-z",
            "--no-index",
            "-v",
        ],
        input=data,
        cwd=repo,
        capture_output=True,
        check=False,
        env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    assert proc.returncode in (0, 1), proc.stderr
    fields = proc.stdout.split(b"\0")
    ignored, unsure = set(), set()
    for i in range(0, len(fields) - 3, 4):
        text = os.fsdecode(fields[i + 3][2:])
        key = (text.rstrip("/"), text.endswith("/"))
        if not fields[i + 2].removeprefix(b"!").removesuffix(b"/"):
            unsure.add(key)
        elif not fields[i + 2].startswith(b"!"):
            ignored.add(key)
    return ignored, unsure


def agree(repo: Path, queries: list[tuple[str, bool]]) -> None:
    """Ours and git's agree. git takes each path's type from the disk, as it does from the
    lower: directories are asked in a copy where they exist, files where they do not."""
    dirs = repo.with_name(repo.name + "-dirs")
    shutil.copytree(repo, dirs, symlinks=True)
    for path, is_dir in queries:
        if is_dir:
            (dirs / path).mkdir(parents=True, exist_ok=True)
    files = [q for q in queries if not q[1] and not (repo / q[0]).is_dir()]
    ignored, unsure = git_ignored(repo, files)
    assert ours(repo, files) - unsure == ignored - unsure
    folders = [q for q in queries if q[1]]
    ignored, unsure = git_ignored(dirs, folders)
    assert ours(dirs, folders) - unsure == ignored - unsure
    shutil.rmtree(dirs)


def ours(repo: Path, queries: list[tuple[str, bool]]) -> set[tuple[str, bool]]:
    def load(rel: str) -> bytes | None:
        path = repo / rel / ".gitignore" if rel else repo / ".gitignore"
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    matcher = Matcher([], load)
    return {(p, d) for p, d in queries if matcher.ignored(p, d)}


def make_repo(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


CORPUS = b"""\
# a comment
\\#hash
\\!bang
*.log
!important.log
/rooted
dir-only/
**/deep-any
lead/**/trail
tail/**
a/*/c
a?c
[abc]x
[!abc]y
[^d]z
[a-c]r
[z-a]rev
[]]br
[!]]nb
x[[:digit:]]
x[[:alpha:][:digit:]]y
[[:nope:]]never
unclosed[
trailing\\
space-kept\\\x20
space-trimmed\x20\x20\x20
q\\*star
***triple
a**b
foo/**/**/bar
**
"""

PATHS = [
    "a.log",
    "x/important.log",
    "important.log",
    "#hash",
    "!bang",
    "rooted",
    "x/rooted",
    "dir-only",
    "x/dir-only",
    "dir-only/f",
    "deep-any",
    "x/y/deep-any",
    "lead/trail",
    "lead/x/y/trail",
    "tail",
    "tail/x",
    "tail/x/y",
    "a/b/c",
    "a/b/d/c",
    "abc",
    "a/c",
    "ax",
    "dx",
    "ay",
    "ey",
    "dz",
    "ez",
    "br",
    "rr",
    "zrev",
    "arev",
    "]br",
    "nb",
    "]nb",
    "x1",
    "xa",
    "x1y",
    "xay",
    "never",
    "unclosed[",
    "trailing\\",
    "trailing",
    "space-kept ",
    "space-kept",
    "space-trimmed",
    "q*star",
    "qxstar",
    "triple",
    "x/triple",
    "ab",
    "aXYb",
    "a/b",
    "foo/bar",
    "foo/x/bar",
    "caf\udce9",
    "new\nline",
]


def all_queries(paths: list[str]) -> list[tuple[str, bool]]:
    return [(p, d) for p in paths for d in (False, True)]


def test_corpus_without_the_catch_all(tmp_path: Path) -> None:
    corpus = CORPUS.replace(b"\n**\n", b"\n")
    repo = make_repo(
        tmp_path / "r", {".gitignore": corpus, "sub/.gitignore": b"!*.log\n/x\nlocal/\n"}
    )
    queries = all_queries(PATHS + [f"sub/{p}" for p in PATHS] + ["sub/local/f", "sub/x", "x"])
    agree(repo, queries)


def test_corpus_with_everything(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", {".gitignore": CORPUS + b"!keep\n"})
    queries = all_queries([*PATHS, "keep", "x/keep"])
    agree(repo, queries)


def test_crlf_bom_and_negated_directories(tmp_path: Path) -> None:
    files = {
        ".gitignore": b"\xef\xbb\xbfbuild/\r\n!build/keep\r\n*.o\r\n",
        "lib/.gitignore": b"!*.o\n",
    }
    repo = make_repo(tmp_path / "r", files)
    queries = all_queries(["build", "build/keep", "build/x.o", "lib/x.o", "lib/sub/x.o", "x.o"])
    agree(repo, queries)
    got = ours(repo, queries)
    assert ("build/keep", False) in got  # nothing below an ignored directory comes back
    assert ("lib/x.o", False) not in got


def test_translate_examples() -> None:
    assert translate(b"a[") is None and translate(b"x\\") is None
    assert translate(b"[[:bogus:]]") is None
    assert translate(b"**/x") == b"(?:.*/)?\\x78"


def test_a_hostile_pattern_stays_linear() -> None:
    lists = [parse(b"*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b\n" + b"**/" * 200 + b"x\n")]
    matcher = Matcher(lists, lambda _rel: None)
    t0 = time.perf_counter()
    assert not matcher.ignored("a" * 4000 + "c", False)
    assert not matcher.ignored("/".join(["d"] * 500) + "/y", False)
    assert time.perf_counter() - t0 < 1.0


def test_prefix_for_a_lower_inside_a_repository(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "r", {".gitignore": b"/proj/gen/\n*.tmp\n", "proj/.gitignore": b"!keep.tmp\n"}
    )
    (repo / "proj").mkdir(exist_ok=True)
    queries = [
        ("gen", True),
        ("gen/x", False),
        ("a.tmp", False),
        ("keep.tmp", False),
        ("src/x", False),
    ]
    assert gitcmd.check_ignore(repo / "proj", queries, ()) == ({"gen", "gen/x", "a.tmp"}, set())


# -- hypothesis ---------------------------------------------------------------------------

_PIECES = st.sampled_from(
    ["a", "b", "c", ".", "-", "*", "**", "?", "[ab]", "[!a]", "[a-c]", "\\*", "/", "!", " ", "x"]
)
_PATTERN = st.lists(_PIECES, min_size=1, max_size=6).map("".join).filter(lambda p: "\n" not in p)
_NAME = st.text(alphabet="abc.x-*? ", min_size=1, max_size=4).filter(lambda n: n not in (".", ".."))
_PATH = st.lists(_NAME, min_size=1, max_size=4).map("/".join)


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    root=st.lists(_PATTERN, max_size=6),
    nested=st.lists(_PATTERN, max_size=3),
    paths=st.lists(_PATH, min_size=1, max_size=12),
)
# git matches a path pattern's literal prefix itself and hands wildmatch the rest, where a
# "**" right after that prefix counts as following a slash: ".**/.?" matches "..?" (CI:
# {('a/..?', True)}), ".**/?" matches ".?" (CI: {('a/.?', False)}), "a**/b" matches "ax/y/b".
@example(root=[], nested=[".**/.?"], paths=["..?"])
@example(root=[], nested=[".**/?"], paths=[".?"])
@example(root=[".**/?", "/.**/**"], nested=[], paths=[".?", "..?", "x/.?"])
@example(root=["a**/b", "!c**/b"], nested=["c/**"], paths=["ax/y/b", "ab", "c/x/b", "cx/y/b"])
def test_hypothesis_matches_git(
    tmp_path: Path, root: list[str], nested: list[str], paths: list[str]
) -> None:
    repo = tmp_path / f"r{time.monotonic_ns()}"
    files = {".gitignore": "\n".join(root).encode(), "a/.gitignore": "\n".join(nested).encode()}
    make_repo(repo, files)
    queries = all_queries([*paths, *(f"a/{p}" for p in paths)])
    agree(repo, queries)
    shutil.rmtree(repo)

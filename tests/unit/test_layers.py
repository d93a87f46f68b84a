"""The package's layers hold: no module imports from a layer above its own, and no import
cycles anywhere. Walks every import statement (module level, inside functions, and under
``TYPE_CHECKING``) of every module in ``supervisor/``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Sub-package -> rank; a module may import only from its own rank or lower ones.
LAYERS: dict[str, int] = {
    "core": 0,
    "engine": 1,
    "state": 2,
    "runtime": 3,
    "tooling": 4,
    "interfaces": 5,
}
#: The public facade (``supervisor/__init__.py``) sits above every layer.
FACADE = len(LAYERS)


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/package``."""
    out: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file that names a module of ours."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                child = f"{module}.{alias.name}"
                if child in known:
                    yield child, node.lineno
                elif module in known:
                    yield module, node.lineno


def _rank(module: str, package: str) -> int:
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return FACADE
    return LAYERS[parts[1]]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (or a self-import)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def check_layers(root: Path, package: str = "supervisor") -> list[str]:
    """Every violation, as readable lines (empty: the layers hold)."""
    known = _modules(root, package)
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        mine = _rank(name, package)
        for target, line in _imports(name, path, known):
            if target == name:
                continue
            graph[name].add(target)
            theirs = _rank(target, package)
            if theirs > mine:
                rel = path.relative_to(root)
                problems.append(f"upward import: {rel}:{line} ({name}) imports {target}")
    for comp in _cycles(graph):
        problems.append("import cycle: " + " -> ".join(comp))
    return problems


def test_the_package_has_no_upward_imports_and_no_cycles() -> None:
    assert check_layers(REPO) == []


def test_every_module_sits_in_a_layer() -> None:
    """Nothing but the facade lives at the top of the package."""
    top = {p.name for p in (REPO / "supervisor").glob("*.py")}
    assert top == {"__init__.py"}
    subpackages = {p.name for p in (REPO / "supervisor").iterdir() if p.is_dir()} - {"__pycache__"}
    assert subpackages == set(LAYERS)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A small package laid out like ours, whose layers hold."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "",
            "pkg/core/a.py": "X = 1\n",
            "pkg/engine/__init__.py": "",
            "pkg/engine/b.py": "from pkg.core.a import X\n",
            "pkg/runtime/__init__.py": "",
            "pkg/runtime/c.py": "from pkg.engine import b\nfrom ..core import a\n",
        },
    )
    return tmp_path


def test_the_checker_passes_a_sound_package(toy: Path) -> None:
    assert check_layers(toy, "pkg") == []


def test_the_checker_catches_an_upward_import(toy: Path) -> None:
    # Break a layer once: the engine reaches up into the runtime (inside a function, where
    # a deferred import would hide it from a module-level scan).
    _write(
        toy,
        {
            "pkg/engine/b.py": "def f():\n    from pkg.runtime.c import a\n",
            "pkg/runtime/c.py": "from ..core import a\n",
        },
    )
    assert check_layers(toy, "pkg") == [
        "upward import: pkg/engine/b.py:2 (pkg.engine.b) imports pkg.runtime.c"
    ]


def test_the_checker_catches_a_cycle_even_within_a_layer(toy: Path) -> None:
    _write(
        toy,
        {
            "pkg/core/a.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg.core.d import Y\n",
            "pkg/core/d.py": "from pkg.core import a\nY = 1\n",
        },
    )
    assert check_layers(toy, "pkg") == ["import cycle: pkg.core.a -> pkg.core.d"]


def test_the_checker_catches_the_facade_imported_from_below(toy: Path) -> None:
    _write(toy, {"pkg/core/a.py": "from pkg import something\n"})
    problems = check_layers(toy, "pkg")
    assert problems == ["upward import: pkg/core/a.py:1 (pkg.core.a) imports pkg"]


#: Size limits that keep units small enough to read in one sitting.
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 400
#: The one place a module or class may be larger, each with its own limit and why: a unit
#: that is one thing is not cut in two to fit a number (an entry no longer needed fails).
SIZE_EXCEPTIONS: dict[str, tuple[int, str]] = {}

#: Calls that read or write the host's files, a socket or the clock.
_IO_CALLS = {
    "open",
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "glob",
    "rglob",
    "realpath",
    "stat",
    "lstat",
    "exists",
    "is_dir",
    "is_file",
    "iterdir",
    "listdir",
    "scandir",
    "resolve",
    "mkdir",
    "unlink",
    "socket",
    "time",
    "monotonic",
    "sleep",
    "now",
}
#: The core modules that read the host's files, as docs/architecture.md says (keep both
#: in step): what each reads.
CORE_IO = {
    "policy.py": {"read_text", "glob", "is_dir"},
    "resolve.py": {"realpath", "lstat"},
    "workspace.py": {"realpath"},
    "paths.py": {"resolve", "is_dir", "is_file"},
}


def _io_calls(text: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _IO_CALLS:
                found.add(name)
    return found


def test_core_reads_the_host_only_where_the_docs_say() -> None:
    seen = {}
    for path in sorted((REPO / "supervisor" / "core").rglob("*.py")):
        calls = _io_calls(path.read_text())
        if calls:
            seen[str(path.relative_to(REPO / "supervisor" / "core"))] = calls
    assert seen == CORE_IO
    doc = (REPO / "docs" / "architecture.md").read_text()
    for name in CORE_IO:
        assert f"`{name}`" in doc, f"docs/architecture.md does not name core/{name}'s I/O"


def oversized(root: Path, package: str, exceptions: dict[str, tuple[int, str]]) -> list[str]:
    """Modules and classes of ``root/package`` over their limit (``exceptions`` by the
    path relative to ``root``, ``path:Class`` for a class)."""
    too_big: list[str] = []
    for path in sorted((root / package).rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(root)
        lines = text.count("\n")
        limit = exceptions.get(str(rel), (MAX_MODULE_LINES, ""))[0]
        if lines > limit:
            too_big.append(f"{rel}: {lines} lines (max {limit})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                limit = exceptions.get(f"{rel}:{node.name}", (MAX_CLASS_LINES, ""))[0]
                if size > limit:
                    too_big.append(f"{rel}: class {node.name} is {size} lines (max {limit})")
    return too_big


def test_no_module_or_class_is_too_large() -> None:
    assert oversized(REPO, "supervisor", SIZE_EXCEPTIONS) == []
    _every_size_exception_is_needed_and_says_why()


def test_a_named_exception_lets_one_unit_be_larger(toy: Path) -> None:
    body = "class Big:\n" + "    x = 1\n" * (MAX_CLASS_LINES + 5)
    (toy / "pkg" / "core" / "big.py").write_text(body)
    assert oversized(toy, "pkg", {}) == [
        f"pkg/core/big.py: class Big is {MAX_CLASS_LINES + 6} lines (max {MAX_CLASS_LINES})"
    ]
    assert oversized(toy, "pkg", {"pkg/core/big.py:Big": (420, "one state machine")}) == []


def _every_size_exception_is_needed_and_says_why() -> None:
    for where, (limit, why) in SIZE_EXCEPTIONS.items():
        path, _, cls = where.partition(":")
        text = (REPO / path).read_text()
        if cls:
            node = next(
                n
                for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.ClassDef) and n.name == cls
            )
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            assert size > MAX_CLASS_LINES, f"{where} fits the limit now: drop its exception"
        else:
            assert text.count("\n") > MAX_MODULE_LINES, f"{where} fits now: drop its exception"
        assert limit > 0 and len(why) > 20, f"{where}: say why it is one unit"

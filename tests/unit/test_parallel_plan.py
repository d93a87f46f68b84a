"""The parallel suite's plan (tests/parallel.py): the groups name files that exist, a file
and its group map to one scope, and every ``serial`` mark says why."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.parallel import SAME_WORKER, scope_of

REPO = Path(__file__).resolve().parents[2]


def test_every_grouped_file_exists_and_is_in_one_group() -> None:
    paths = [p for files in SAME_WORKER.values() for p in files]
    assert len(paths) == len(set(paths))
    assert [p for p in paths if not (REPO / p).is_file()] == []


def test_a_test_runs_in_its_files_scope_or_its_groups() -> None:
    assert scope_of("tests/unit/test_x.py::test_a[1]") == "tests/unit/test_x.py"
    assert scope_of("tests/unit/test_x.py::Cls::test_b") == "tests/unit/test_x.py"
    for group, files in SAME_WORKER.items():
        assert {scope_of(f"{f}::test_any") for f in files} == {group}


def test_every_serial_mark_says_why() -> None:
    marks = 0
    for path in (REPO / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "serial"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "mark"
            ):
                marks += 1
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "serial"
            ):
                assert node.args and isinstance(node.args[0], ast.Constant), path
                assert len(str(node.args[0].value)) > 20, path
                marks -= 1
    assert marks == 0  # no bare ``@pytest.mark.serial`` without a reason

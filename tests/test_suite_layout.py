"""The test suite's own shape: tests share fixtures and builders through conftest.py and helper modules,
never by importing another test module (which runs that module's tests' imports, fixtures and
parametrisations wherever it is imported, and ties two files' tests together)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        found += [n for n in names if n.startswith("tests.") and n.split(".")[-1].startswith("test_")]
    return found


def test_no_test_module_imports_another() -> None:
    offenders = {
        str(path.relative_to(TESTS)): modules
        for path in sorted(TESTS.rglob("*.py"))
        if (modules := imported_test_modules(path))
    }
    assert offenders == {}, "share helpers through conftest.py or a helper module, not a test_*.py"

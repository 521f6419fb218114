"""Rules of the house that no single behaviour test would notice (docs/architecture.md): every
exception krex defines is a KrexError; comments cite the repository's docs, never a run of a
results folder or an issue number of a tracker the repository does not carry; no function or
class is larger than a reader holds."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from krex.core.errors import KrexError

ROOT = Path(__file__).resolve().parents[1]
KREX = ROOT / "krex"


def _modules() -> list[str]:
    out = []
    for p in sorted(KREX.rglob("*.py")):
        if "__pycache__" in p.parts or "_auto" in p.parts or p.name == "_native_build.py":
            continue
        rel = p.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append(".".join(parts))
    return out


@pytest.mark.parametrize("name", _modules())
def test_every_exception_krex_defines_is_a_krex_error(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        if (e.name or "").split(".")[0] == "krex":
            raise
        pytest.skip(f"needs {e.name}")  # a benchmark task's framework
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ == name and issubclass(cls, BaseException):
            assert issubclass(cls, KrexError), f"{name}.{cls.__name__} is not a KrexError"


# A run of a results folder (docs/results/...), "run 27", "runs 14-16", or "issue #48": the
# current figure and the reason belong in docs/ (another project's tracker may be cited by name).
CITATION = re.compile(r"docs/results/|\bruns? \d+\b|(?<!HAMi )issue #\d+")


def test_comments_cite_docs_not_runs_or_issue_numbers() -> None:
    found = []
    for p in sorted([*KREX.rglob("*.py"), *(ROOT / "shim").rglob("*.[ch]")]):
        if "__pycache__" in p.parts:
            continue
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if CITATION.search(line):
                found.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_citation_rule_catches_what_it_forbids() -> None:
    for bad in ("(docs/results/h200-pool/probe/)", "(run 27)", "runs 14-16", "(issue #48)"):
        assert CITATION.search(bad), bad
    for good in ("(docs/pool.md)", "HAMi issue #1707", "one run of 2 s"):
        assert not CITATION.search(good), good


# Sizes a reader can hold (docs/architecture.md, "House rules"): a function of at most
# MAX_FUNCTION_LINES lines from its `def` (docstring included), a class of at most
# MAX_METHODS methods of its own.
MAX_FUNCTION_LINES = 60
MAX_METHODS = 25


def _sizes(tree: ast.AST) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(functions with their lines, classes with their methods) of one module."""
    functions, classes = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            functions.append((node.name, (node.end_lineno or node.lineno) - node.lineno + 1))
        elif isinstance(node, ast.ClassDef):
            methods = [
                x for x in node.body if isinstance(x, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            classes.append((node.name, len(methods)))
    return functions, classes


def test_no_function_or_class_is_larger_than_a_reader_holds() -> None:
    found = []
    for p in sorted(KREX.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        functions, classes = _sizes(ast.parse(p.read_text()))
        rel = p.relative_to(ROOT)
        found += [f"{rel}: {f}() is {n} lines" for f, n in functions if n > MAX_FUNCTION_LINES]
        found += [f"{rel}: class {c} has {n} methods" for c, n in classes if n > MAX_METHODS]
    assert not found, "\n".join(found)


def test_the_size_rule_counts_what_it_limits() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    methods = "\n".join(f"    def m{i}(self): pass" for i in range(MAX_METHODS + 1))
    functions, classes = _sizes(ast.parse(f"@dec\ndef long():\n{body}\n\nclass C:\n{methods}\n"))
    assert functions[0] == ("long", MAX_FUNCTION_LINES + 1)
    assert classes == [("C", MAX_METHODS + 1)]


def test_krex_run_starts_without_the_daemons_modules() -> None:
    """Every command pays `krex run`'s start-up: the client imports neither asyncio (the
    daemon's streams, ~20 ms of CPU) nor the daemon's package."""
    import subprocess
    import sys

    code = (
        "import sys, krex.cli\nfrom krex.client import run\n"
        "print(sorted(m for m in sys.modules if m == 'asyncio' or m.startswith('krex.daemon')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout

"""Rules of the house that no single behaviour test would notice (docs/architecture.md): every
exception krex defines is a KrexError, and comments cite the repository's docs, never a run of a
results folder or an issue number of a tracker the repository does not carry."""

from __future__ import annotations

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

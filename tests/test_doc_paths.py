"""Paths the docs name resolve: relative markdown links in README.md and docs/, `docs/...` paths
named anywhere in the docs, scripts, tests and package, and `../` paths in docs/ (results
folders move to docs/results/archive/ as newer runs supersede them; this catches a path left
behind)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOC_PATH = re.compile(r"(?<![\w/.])(docs/[\w./-]*[\w/])")
UP_PATH = re.compile(r"`((?:\.\./)+[\w./-]*)`")
# Raw output as it came back: the device returned at most 8 files from that call, not its plots.
MISSING_AS_RECORDED = {
    ("docs/results/h200x2/run1/gpu0/report.md", "throughput.png"),
    ("docs/results/h200x2/run1/gpu0/report.md", "time_split.png"),
}


def _files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").rglob("*.md"))]
    for pattern in ("scripts/**/*.py", "scripts/**/*.sh", "tests/*.py", "krex/**/*.py"):
        files += sorted(ROOT.glob(pattern))
    return [f for f in files if f != Path(__file__).resolve()]  # this file's examples are made up


def _unresolved(f: Path, root: Path = ROOT) -> list[str]:
    rel = f.relative_to(root).as_posix()
    bad = []
    for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
        if f.suffix == ".md":
            for t in LINK.findall(line):
                if t.startswith(("http://", "https://", "mailto:", "#")):
                    continue
                target = t.split("#")[0]
                if not (f.parent / target).exists() and (rel, target) not in MISSING_AS_RECORDED:
                    bad.append(f"{rel}:{n}: link {t}")
            bad += [f"{rel}:{n}: {t}" for t in UP_PATH.findall(line) if not (f.parent / t).exists()]
        for t in DOC_PATH.findall(line):
            if "..." not in t and "*" not in t and not (root / t).exists():
                bad.append(f"{rel}:{n}: {t}")
    return bad


def test_every_path_the_docs_name_resolves() -> None:
    bad = [b for f in _files() for b in _unresolved(f)]
    assert not bad, "\n".join(bad)


def test_a_moved_results_folder_left_behind_is_caught(tmp_path: Path) -> None:
    (tmp_path / "docs" / "results" / "run").mkdir(parents=True)
    doc = tmp_path / "docs" / "results" / "README.md"
    doc.write_text(
        "[ok](run/) `docs/results/run/` `../results/run/`\n"
        "[moved](old/README.md) `docs/results/old/` `../results/old/`\n"
    )
    assert [b.split(": ", 1)[1] for b in _unresolved(doc, tmp_path)] == [
        "link old/README.md",
        "../results/old/",
        "docs/results/old/",
    ]

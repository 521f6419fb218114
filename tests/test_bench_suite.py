"""The real-GPU suite's definition (its commands run only where there is a GPU: the H200 run in
docs/results/archive/h200/). Here: every listed candidate exists, the profiles are what
docs/bench.md says, and where PyTorch is missing `--profile quick` is one clear error."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from krex.bench import suite

KREX = [sys.executable, "-m", "krex.cli"]


def _variants_of(task: str) -> list[str]:
    """The keys of VARIANTS in krex/bench/tasks/TASK.py, read without importing torch."""
    tree = ast.parse((suite.TASKS_DIR / f"{task}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "VARIANTS" for t in node.targets
        ):
            assert isinstance(node.value, ast.Dict)
            return [ast.literal_eval(k) for k in node.value.keys if k is not None]
    raise AssertionError(f"{task}.py has no VARIANTS")


def test_every_listed_candidate_exists_and_every_candidate_is_listed() -> None:
    for task, variants in suite.FULL.items():
        assert sorted(variants) == sorted(_variants_of(task)), task
        assert len(variants) >= 3, f"{task}: too few candidates to rank"


def test_profiles() -> None:
    quick, full = suite.commands("quick"), suite.commands("full")
    assert {c.task for c in quick} == {c.task for c in full} == set(suite.FULL)
    assert {(c.task, c.variant) for c in quick} < {(c.task, c.variant) for c in full}
    assert not any(c.variant in ("compiled", "max-autotune") for c in quick)
    for c in full:
        assert not c.simulated
        assert Path(c.argv[1]).is_file() and c.argv[2] == c.variant
    assert [c.task for c in suite.commands("full", ["conv"])] == ["conv"] * len(suite.FULL["conv"])
    with pytest.raises(suite.SuiteError, match="unknown task"):
        suite.commands("quick", ["fft"])


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None, reason="PyTorch is installed here"
)
def test_quick_without_torch_is_one_clear_error(tmp_path: Path) -> None:
    p = subprocess.run(
        [*KREX, "bench", "run", "--profile", "quick", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    assert "needs PyTorch, Triton and a CUDA GPU (cannot import torch)" in p.stderr, p.stderr
    assert not (tmp_path / "x" / "results.json").exists()

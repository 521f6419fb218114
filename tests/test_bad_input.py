"""Bad input never crashes or hangs a program under the shim: it runs with one warning."""

from __future__ import annotations

import mmap
import subprocess
from pathlib import Path

import pytest
from conftest import C_DIR, Node, compile_c, remove_shm, unique

from krex.core.shm import Segment, SegmentError


def run_workload(node: Node, **env: str | None) -> subprocess.CompletedProcess[str]:
    e = node.env(tenant=1)
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run(
        [node.native.program("workload"), "submit", "2", "50"],
        env=e,
        capture_output=True,
        text=True,
        timeout=60,
    )


def krex_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("krex[")]


def assert_runs_with_one_warning(p: subprocess.CompletedProcess[str], words: str) -> None:
    assert p.returncode == 0, p.stderr
    lines = krex_lines(p.stderr)
    assert len(lines) == 1, p.stderr
    assert words in lines[0], lines[0]


def test_missing_segment(node: Node) -> None:
    """A segment name that does not exist: pass-through, one warning naming it."""
    p = run_workload(node, KREX_SHM="/krex-no-such-segment")
    assert_runs_with_one_warning(p, "cannot open shared segment /krex-no-such-segment")


def test_no_segment_named(node: Node) -> None:
    """LD_PRELOAD without KREX_SHM: pass-through, one warning."""
    p = run_workload(node, KREX_SHM=None)
    assert_runs_with_one_warning(p, "KREX_SHM is not set")


@pytest.mark.parametrize("value", ["0", "-3", "abc", ""])
def test_bad_tenant(node: Node, value: str) -> None:
    p = run_workload(node, KREX_TENANT=value)
    assert_runs_with_one_warning(p, "KREX_TENANT must be a positive integer")


def test_gpu_out_of_range(node: Node) -> None:
    p = run_workload(node, KREX_GPU="7")
    assert_runs_with_one_warning(p, "KREX_GPU=7 but the segment has 1 GPUs")


@pytest.mark.parametrize("value", ["0,0", "a", "0,", ",0", "0,,0", "-1", "0;1"])
def test_malformed_gpu_list(node: Node, value: str) -> None:
    p = run_workload(node, KREX_GPU=value)
    assert_runs_with_one_warning(
        p, f'KREX_GPU must be GPU indices separated by commas, each once (got "{value}")'
    )


def _patched_segment(offset: int, data: bytes) -> str:
    name = unique("krex-bad")
    seg = Segment.create(name, n_gpus=1, n_slots=8)
    seg.close()
    path = Path("/dev/shm") / name.lstrip("/")
    with path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[offset : offset + len(data)] = data
    return name


@pytest.mark.parametrize(
    ("offset", "data", "words"),
    [
        (0, b"JUNK", "does not start with the KREX magic"),
        (4, (7).to_bytes(2, "little"), "another major version"),
        (24, (99999).to_bytes(4, "little"), "inconsistent"),
        (28, (0).to_bytes(4, "little"), "never fully initialised"),
    ],
    ids=["magic", "version", "geometry", "not-ready"],
)
def test_corrupt_or_foreign_segment(node: Node, offset: int, data: bytes, words: str) -> None:
    """Each kind of damage is recognised: one warning that says which, the program runs."""
    name = _patched_segment(offset, data)
    try:
        p = run_workload(node, KREX_SHM=name)
        assert_runs_with_one_warning(p, words)
        with pytest.raises(SegmentError, match=words):
            Segment.attach(name)
    finally:
        remove_shm(name)


def test_truncated_segment(node: Node) -> None:
    name = unique("krex-short")
    path = Path("/dev/shm") / name.lstrip("/")
    path.write_bytes(b"KREX" + bytes(12))
    try:
        assert_runs_with_one_warning(run_workload(node, KREX_SHM=name), "too small")
        with pytest.raises(SegmentError, match="too small"):
            Segment.attach(name)
    finally:
        remove_shm(name)


def test_no_real_driver(node: Node, tmp_path: Path) -> None:
    """A gated entry point called where no libcuda exists: one clear error code, no hang."""
    exe = compile_c(C_DIR / "nodriver.c", tmp_path / "nodriver")
    env = node.env(tenant=1)
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # no libcuda.so.1 anywhere on the path
    p = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["500", "500"]  # CUDA_ERROR_NOT_FOUND, every time
    lines = krex_lines(p.stderr)
    assert len(lines) == 1 and "the real driver has no cuLaunchKernel" in lines[0]


def test_python_side_errors_are_clear() -> None:
    with pytest.raises(SegmentError, match="no such KREX segment"):
        Segment.attach("/krex-definitely-missing")
    with pytest.raises(ValueError, match="n_gpus"):
        Segment.create(unique("krex-x"), n_gpus=0)
    name = unique("krex-dup")
    seg = Segment.create(name)
    try:
        with pytest.raises(SegmentError, match="exists already"):
            Segment.create(name)
        with pytest.raises(ValueError, match="GPU 3 is not in this segment"):
            seg.gate_close(3, owner=1)
        with pytest.raises(ValueError, match="positive integer"):
            seg.gate_close(0, owner=0)
    finally:
        seg.close()
        seg.unlink()

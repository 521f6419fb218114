"""Client, shim and daemon are one build, or the client says so (issue #49, A).

A second "checkout" is the package copied into a directory of the test's own and put first on
PYTHONPATH (its own native parts included); changing one byte of it makes it another build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import KREX, Daemon

from krex.core.build import build_id
from krex.core.paths import package_dir


def _checkout(tmp_path: Path, name: str) -> dict[str, str]:
    """A copy of this krex under tmp_path/name; the environment that runs it."""
    root = tmp_path / name
    shutil.copytree(package_dir(), root / "krex", ignore=shutil.ignore_patterns("__pycache__"))
    return {**os.environ, "PYTHONPATH": str(root)}


def _rebuild(env: dict[str, str], rel: str) -> None:
    """The copy's `rel` changed (as an edit and `make build` would): another build."""
    with open(Path(env["PYTHONPATH"], "krex", rel), "ab") as f:
        f.write(b"\n# changed\n" if rel.endswith(".py") else b"\0")


def _run(sock: Path, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KREX, "run", "--sim", "--socket", str(sock), "--", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd="/",
    )


def _build_of(env: dict[str, str]) -> str:
    code = "from krex.core.build import build_id, package_dir; print(build_id(), package_dir())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/", check=True
    )
    return out.stdout.strip()


def test_a_client_of_another_checkout_is_refused_with_one_clear_error(tmp_path: Path) -> None:
    """A daemon of this checkout runs; `krex run` of another (one source file differs) is
    refused before its command runs: exit 125, one line naming both builds and their paths,
    the socket, and what to do (before the fix: it silently joined)."""
    other = _checkout(tmp_path, "other")
    _rebuild(other, "errors.py")
    theirs, where = _build_of(other).split()
    assert theirs != build_id() and where == str(tmp_path / "other" / "krex")
    d = Daemon(tmp_path / "krex.sock")
    d.start()
    try:
        marker = tmp_path / "ran"
        p = _run(d.socket, other, "touch", str(marker))
        assert p.returncode == 125, p.stderr
        assert not marker.exists(), "the command ran under another build's daemon"
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("krex run: "), p.stderr
        for part in (theirs, where, build_id(), str(package_dir()), str(d.socket)):
            assert part in lines[0], (part, lines[0])
        assert f"krex daemon stop --socket {d.socket}" in lines[0]
        # The same build is no error.
        same = _run(d.socket, dict(os.environ), "touch", str(marker))
        assert same.returncode == 0 and marker.exists(), same.stderr
    finally:
        d.stop()


def test_a_shim_rebuilt_under_a_running_daemon_is_refused(tmp_path: Path) -> None:
    """The daemon's own checkout has its libkrex.so rebuilt while it runs: the next `krex
    run` of that checkout (whose shim the daemon would preload into the command) is refused,
    naming the same path twice with two builds (before the fix: the new shim ran under the
    old daemon)."""
    mine = _checkout(tmp_path, "mine")
    d = Daemon(tmp_path / "krex.sock")
    d.start(env=mine, cwd="/")
    try:
        assert _run(d.socket, mine, "true").returncode == 0
        _rebuild(mine, "_lib/libkrex.so")
        p = _run(d.socket, mine, "true")
        assert p.returncode == 125, p.stderr
        assert "found a daemon of another build" in p.stderr
        assert p.stderr.count(str(tmp_path / "mine" / "krex")) == 2, p.stderr
    finally:
        d.stop()


def test_daemon_stop_and_hello_name_the_daemon_s_build(tmp_path: Path) -> None:
    """`krex daemon stop` says which daemon it stopped (version, build, path); `hello`
    answers with the build (before the fix: neither did)."""
    other = _checkout(tmp_path, "other")
    _rebuild(other, "errors.py")
    theirs, where = _build_of(other).split()
    d = Daemon(tmp_path / "krex.sock")
    d.start(env=other, cwd="/")
    hello = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
            ' s.sendall(b\'{"v":1,"op":"hello"}\\n\'); print(s.makefile().readline())',
            str(d.socket),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert f'"build":"{theirs}"' in hello.stdout.replace(" ", ""), hello.stdout
    p = subprocess.run(
        [*KREX, "daemon", "stop", "--socket", str(d.socket)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert p.returncode == 0, p.stderr
    assert f"build {theirs}, {where}" in p.stderr, p.stderr
    assert d.proc is not None and d.proc.wait(timeout=30) == 0

"""What a new user hits in the first hour (issue #19): options, configuration files, reports,
time-outs, the auto-started daemon and `krex daemon stop`, on the command line."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import KREX, Daemon, run_argv, running


def krex(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KREX, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env
    )


def one_line(stderr: str) -> str:
    """The only non-empty line of stderr (fails on a traceback or several lines)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running(Daemon(tmp_path_factory.mktemp("d") / "krex.sock")) as d:
        yield d


@pytest.fixture
def nowhere(tmp_path: Path) -> str:
    """A socket path under a regular file: nothing answers, and no daemon can start there."""
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file" / "krex.sock")


# 1. Options before the command are krex's.
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["run", "--sim", "--reprot", "r.json", "--", "true"], "--reprot"),
        (["run", "--sim", "--sim-typo", "--", "true"], "--sim-typo"),
        (["run", "--sim-typo", "true"], "--sim-typo"),
        (["region", "--typo", "--", "true"], "--typo"),
    ],
)
def test_an_unknown_option_before_the_command_is_a_usage_error(
    args: list[str], words: str, nowhere: str, tmp_path: Path
) -> None:
    if args[0] == "run":
        args = [args[0], "--socket", nowhere, *args[1:]]
    p = krex(*args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert f"No such option '{words}'" in p.stderr, p.stderr
    assert not (tmp_path / "r.json").exists()


def test_options_after_the_command_or_after_dashes_are_the_commands(daemon: Daemon) -> None:
    show = 'echo "$@"'
    p = subprocess.run(
        [*run_argv(daemon), "--", "sh", "-c", show, "sh", "--its-own", "-x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout) == (0, "--its-own -x\n"), p.stderr
    p = subprocess.run(
        [*run_argv(daemon), "sh", "-c", show, "sh", "--sim-typo", "--", "y"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout) == (0, "--sim-typo -- y\n"), p.stderr


# 5. Time-outs on the command line are finite and positive.
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "-1", "0"])
@pytest.mark.parametrize(
    "args",
    [
        ["run", "--queue-timeout", "{}", "--", "true"],
        ["run", "--region-timeout", "{}", "--", "true"],
        ["top", "--once", "--interval", "{}"],
    ],
)
def test_a_time_out_that_is_not_a_positive_finite_number_is_a_usage_error(
    args: list[str], value: str, nowhere: str
) -> None:
    p = krex(*(a.format(value) for a in args), "--socket", nowhere)
    assert p.returncode == 2, p.stderr
    assert "Invalid value for" in p.stderr and value in p.stderr, p.stderr


# Friction: the help says what a first user looks for.
def test_help_texts() -> None:
    run_help = krex("run", "--help").stdout
    assert "125" in run_help and "127" in run_help
    assert "krex-cold" in krex("bench", "run", "--help").stdout
    top_help = krex("top", "--help").stdout
    assert "Seconds between frames" in top_help

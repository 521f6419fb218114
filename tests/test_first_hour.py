"""What a new user hits in the first hour (issue #19): options, configuration files, reports,
time-outs, the auto-started daemon and `krex daemon stop`, on the command line."""

from __future__ import annotations

import os
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


# 2. A bad configuration file: one line naming the key (and the type expected), never a traceback.
CONFIGS = {
    "typo": (b"[gpus]\nslot = 3\n", "unknown key gpus.slot (did you mean gpus.slots?)"),
    "invalid": (b"[gpus\n", "not valid TOML"),
    "wrong type": (b'[gpus]\nslots = "8"\n', "gpus.slots has the wrong type: an integer"),
    "missing": (None, "cannot read the configuration"),
    "not utf-8": (b'[daemon]\nsocket = "\xff\xfe"\n', "not UTF-8"),
    "deep": (b"a = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    "long segment": (b'[daemon]\nsegment = "/' + b"x" * 300 + b'"\n', "daemon.segment"),
    "long socket": (b'[daemon]\nsocket = "/tmp/' + b"x" * 200 + b'"\n', "too long"),
}
COMMANDS = {
    "run": (["run", "--sim", "--", "true"], 125),
    "status": (["status"], 2),
    "top": (["top", "--once"], 2),
    "daemon": (["daemon", "--sim", "--socket", "{tmp}/d.sock"], 2),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CONFIGS)
def test_a_bad_configuration_is_one_line_and_the_documented_exit(
    tmp_path: Path, case: str, command: str
) -> None:
    content, words = CONFIGS[case]
    cfg = tmp_path / "config.toml"
    if content is not None:
        cfg.write_bytes(content)
    env = {k: v for k, v in os.environ.items() if k != "KREX_SOCKET"}
    env |= {"KREX_CONFIG": str(cfg), "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    args, code = COMMANDS[command]
    p = krex(*(a.format(tmp=tmp_path) for a in args), env=env)
    assert p.returncode == code, p.stderr
    line = one_line(p.stderr)
    assert line.startswith(f"krex {command}: ") and words in line, line
    assert not (tmp_path / "d.sock").exists()


# Friction: the help says what a first user looks for.
def test_help_texts() -> None:
    run_help = krex("run", "--help").stdout
    assert "125" in run_help and "127" in run_help
    assert "krex-cold" in krex("bench", "run", "--help").stdout
    top_help = krex("top", "--help").stdout
    assert "Seconds between frames" in top_help

"""What a new user hits in the first hour (issue #19): options, configuration files, reports,
time-outs, the auto-started daemon and `krex daemon stop`, on the command line."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
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
        ["daemon", "stop", "--timeout", "{}"],
    ],
)
def test_a_time_out_that_is_not_a_positive_finite_number_is_a_usage_error(
    args: list[str], value: str, nowhere: str
) -> None:
    p = krex(*(a.format(value) for a in args), "--socket", nowhere)
    assert p.returncode == 2, p.stderr
    assert "Invalid value for" in p.stderr and value in p.stderr, p.stderr


@pytest.mark.parametrize("flag", ["--settle", "--capped-settle"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "5.5", "x"])
def test_a_settle_that_is_not_0_to_5_seconds_is_a_usage_error(
    flag: str, value: str, nowhere: str
) -> None:
    p = krex("run", flag, value, "--socket", nowhere, "--", "true")
    assert p.returncode == 2, p.stderr
    assert f"Invalid value for '{flag}'" in p.stderr and value in p.stderr, p.stderr
    if value != "x":
        assert "seconds must be from 0 to 5" in p.stderr, p.stderr


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


# 7. --report: checked before the command runs, written whole or not at all.
@pytest.mark.parametrize("where", ["a directory", "missing parent", "unwritable"])
def test_a_report_that_cannot_be_written_stops_krex_run_before_the_command(
    daemon: Daemon, tmp_path: Path, where: str
) -> None:
    report = {
        "a directory": tmp_path,
        "missing parent": tmp_path / "no" / "r.json",
        "unwritable": Path("/proc/krex-report.json"),  # nobody creates files there, not root
    }[where]
    marker = tmp_path / "ran"
    p = subprocess.run(
        [*run_argv(daemon), "--report", str(report), "--", "touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 125, p.stderr
    assert one_line(p.stderr).startswith(f"krex run: --report {report}: ")
    assert not marker.exists(), "the command ran"


def test_a_report_that_does_not_fit_leaves_the_previous_one(daemon: Daemon, tmp_path: Path) -> None:
    """A full disk (here: a file size limit, which fails the write the same way) must not
    leave a truncated or empty report."""
    report = tmp_path / "r.json"
    report.write_text("previous\n")

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    p = subprocess.run(
        [*run_argv(daemon), "--report", str(report), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=small_files,
    )
    assert p.returncode == 0, p.stderr
    assert "cannot write the report" in one_line(p.stderr)
    assert report.read_text() == "previous\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.json"], "a temporary file is left"
    # And without the limit it is written whole, replacing the previous one.
    p = subprocess.run(
        [*run_argv(daemon), "--report", str(report), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and json.loads(report.read_text())["exit_code"] == 0, p.stderr
    umask = os.umask(0)
    os.umask(umask)
    assert report.stat().st_mode & 0o777 == 0o666 & ~umask, "open()'s mode, not mkstemp's"


def test_a_report_to_a_device_or_through_a_symlink(daemon: Daemon, tmp_path: Path) -> None:
    """A device, pipe or file krex run has open is written in place (never replaced by a new
    file); a symlink's target is replaced and the symlink stays."""
    p = subprocess.run(
        [*run_argv(daemon), "--report", "/dev/stdout", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and json.loads(p.stdout)["exit_code"] == 0, p.stderr
    out = tmp_path / "out.txt"  # stdout a regular file: written in place, not renamed over
    with out.open("w") as f:
        p = subprocess.run(
            [*run_argv(daemon), "--report", "/dev/stdout", "--", "echo", "from the command"],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert p.returncode == 0, p.stderr
    first, rest = out.read_text().split("\n", 1)
    assert first == "from the command" and json.loads(rest)["exit_code"] == 0
    real = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    p = subprocess.run(
        [*run_argv(daemon), "--report", str(link), "--", "sh", "-c", "exit 3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 3, p.stderr
    assert link.is_symlink() and json.loads(real.read_text())["exit_code"] == 3


# 8. The daemon krex run starts does not import krex from the current directory.
def test_the_auto_started_daemon_does_not_depend_on_the_current_directory(tmp_path: Path) -> None:
    fake = tmp_path / "checkout"
    (fake / "krex").mkdir(parents=True)
    (fake / "krex" / "__init__.py").write_text("raise SystemExit('the fake krex was imported')\n")
    (fake / "config.toml").write_text("[gpus]\nslots = 3\n")
    sock = tmp_path / "auto" / "krex.sock"
    console = Path(sys.executable).with_name("krex")  # as a user runs it: not `python -m`
    env = {**os.environ, "KREX_CONFIG": "config.toml"}  # relative to the user's directory
    try:
        p = subprocess.run(
            [str(console), "run", "--sim", "--socket", str(sock), "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=fake,
            env=env,
        )
        assert p.returncode == 0, p.stderr + (sock.parent / "krex.log").read_text()
        st = krex("status", "--json", "--socket", str(sock))
        assert json.loads(st.stdout)["gpus"][0]["slots"] == 3, "the relative config was read"
    finally:
        stopped = krex("daemon", "stop", "--socket", str(sock), "--timeout", "30")
    assert stopped.returncode == 0 and "stopped the daemon" in stopped.stderr, stopped.stderr
    assert not sock.exists()


def test_daemon_stop_without_a_daemon_says_so(tmp_path: Path) -> None:
    p = krex("daemon", "stop", "--socket", str(tmp_path / "krex.sock"))
    assert p.returncode == 0 and "no krex daemon runs on" in one_line(p.stderr)


# Friction: the help says what a first user looks for.
def test_help_texts() -> None:
    run_help = krex("run", "--help").stdout
    assert "125" in run_help and "127" in run_help
    assert "krex-cold" in krex("bench", "run", "--help").stdout
    top_help = krex("top", "--help").stdout
    assert "Seconds between frames" in top_help

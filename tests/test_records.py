"""Honest records (issue #49): what `krex run` says and writes whatever ends it, on the
simulated GPU with a daemon of the module's own. Each case failed on main eaabccf."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import KREX, Daemon, run_argv

# The keys every report has (docs/user-guide.md), whatever ended krex run.
KEYS = {"exit_code", "gpu", "tenant", "wall_s", "argv", "pool", "intercepted", "regions", "memory"}

HOLD = textwrap.dedent("""
    import sys, time
    import krex
    with krex.region():
        print("in region", flush=True)
        time.sleep(float(sys.argv[1]))
    print("out", flush=True)
""")


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("records")
    daemon = Daemon(tmp / "krex.sock", "--slots", "1")
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


def run(d: Daemon, tmp: Path, *argv: str, opts: tuple[str, ...] = ()) -> dict[str, Any]:
    report = tmp / f"r-{time.monotonic_ns()}.json"
    p = subprocess.run(
        [*run_argv(d), "--report", str(report), *opts, "--", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    rep = json.loads(report.read_text()) if report.exists() else None
    return {"rc": p.returncode, "out": p.stdout, "err": p.stderr, "report": rep}


def test_a_region_revoked_by_its_time_out_is_not_clean_and_krex_run_says_so(
    d: Daemon, tmp_path: Path
) -> None:
    """A region that runs past --region-timeout is revoked: what its owner timed after that
    ran unprotected. Its record says clean false with the reason, and krex run says one line."""
    r = run(d, tmp_path, sys.executable, "-c", HOLD, "2.5", opts=("--region-timeout", "0.5"))
    assert r["rc"] == 0, r["err"]
    (region,) = r["report"]["regions"]
    assert region["revoked"] and not region["clean"], region
    assert any("time-out" in p for p in region["problems"]), region
    assert "1 of 1 region(s) of the command were not clean" in r["err"], r["err"]


def test_a_queue_time_out_says_so_and_writes_the_report(d: Daemon, tmp_path: Path) -> None:
    """--queue-timeout with no slot free: the message names it (it used to say the daemon did
    not answer), and --report is written with every key and the error."""
    holder = subprocess.Popen(
        [*run_argv(d), "--", sys.executable, "-c", HOLD, "6"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("in region")
        r = run(d, tmp_path, "true", opts=("--queue-timeout", "1"))
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert r["rc"] == 125
    assert "no slot became free within --queue-timeout 1 s" in r["err"], r["err"]
    assert r["report"] is not None and set(r["report"]) >= KEYS, r["report"]
    assert "queue-timeout" in r["report"]["error"] and r["report"]["regions"] == []


def test_auto_regions_before_the_command_takes_the_command(d: Daemon, tmp_path: Path) -> None:
    """`krex run --auto-regions python x.py`: the option's value is optional, so the command's
    first word was taken for names to wrap, and the run refused with 125 after admission. A
    program is the command; a value that is neither a name nor a program is refused before
    anything is admitted."""
    script = tmp_path / "x.py"
    script.write_text("print('ran')\n")
    p = subprocess.run(
        [*run_argv(d), "--auto-regions", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout) == (0, "ran\n"), p.stderr
    before = d.log.read_text().count("admitted")
    p = subprocess.run(
        [*run_argv(d), "--auto-regions=nosuchname", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 125 and "--auto-regions" in p.stderr, p.stderr
    assert d.log.read_text().count("admitted") == before


def test_top_without_a_terminal_shows_one_frame_and_ends(tmp_path: Path) -> None:
    """Not to a terminal, `krex top` wrote nothing and retried forever with no daemon."""
    p = subprocess.run(
        [*KREX, "top", "--sim", "--socket", str(tmp_path / "none.sock")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 1 and "krex top" in p.stdout + p.stderr


def test_config_show_lists_every_regions_key() -> None:
    p = subprocess.run([*KREX, "config", "show", "--sim"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "capped_settle_s" in p.stdout and "unknown_gib" in p.stdout, p.stdout


def test_a_daemon_stopped_under_a_command_is_not_said_to_have_died(tmp_path: Path) -> None:
    """`krex daemon stop` while a command runs: its report keeps every key (it had no
    `regions`, and the README's own check line crashed on it) with the error, and krex run says
    the daemon stopped, not died."""
    daemon = Daemon(tmp_path / "krex.sock")
    daemon.start()
    report = tmp_path / "r.json"
    p = subprocess.Popen(
        [*run_argv(daemon), "--report", str(report), "--", sys.executable, "-c", "import time\n"
         "print('started', flush=True)\ntime.sleep(3)\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert p.stdout is not None and p.stdout.readline() == "started\n"
        daemon.stop()
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    rep = json.loads(report.read_text())
    assert set(rep) >= KEYS and rep["regions"] == [] and rep.get("error"), rep
    assert "died" not in err and "stopped" in err, err

"""scripts/bench/kb_memory.py without a GPU: its problem list, its summary's maths, the krex
reports' figures and its time budget, with a fake command in place of the KernelBench runner
(the GPU runs themselves are for docs/results/)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import load_script

FAKE = """
import os, subprocess, sys, time
name = os.path.basename(sys.argv[1])
if name.startswith("ok"):
    print("warming up")
    print('{"median_ms": 1.0, "problem": "%s"}' % name)
    print('{"median_ms": %s, "problem": "%s"}' % (2.0 if sys.argv[2] == "compile" else 1.5, name))
elif name.startswith("oom"):
    print("Traceback (most recent call last):", file=sys.stderr)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB", file=sys.stderr)
    sys.exit(1)
elif name.startswith("bad"):
    print("error: RuntimeError: boom", file=sys.stderr)
    sys.exit(1)
elif name.startswith("hang"):
    child = subprocess.Popen(["sleep", "60"])  # in the command's process group
    open(sys.argv[3], "w").write(str(child.pid))
    time.sleep(60)
"""


@pytest.fixture
def kb() -> Any:
    return load_script("scripts/bench/kb_memory.py")


def fake_argv(tmp: Path) -> Any:
    script = tmp / "fake.py"
    script.write_text(textwrap.dedent(FAKE))
    return lambda c: [sys.executable, str(script), c.problem, c.variant, str(tmp / "grandchild")]


def test_the_problems_are_16_level1_files_from_under_1_to_24_gib(kb: Any) -> None:
    files = [p.file for p in kb.PROBLEMS]
    assert len(files) == len(set(files)) == 16
    assert all(re.fullmatch(r"[1-9][0-9]?_\w+\.py", f) for f in files), files
    assert all(0 < p.eager_gib <= p.compile_gib <= 24 for p in kb.PROBLEMS)
    assert min(p.eager_gib for p in kb.PROBLEMS) < 1 <= max(p.eager_gib for p in kb.PROBLEMS)
    assert max(p.compile_gib for p in kb.PROBLEMS) == 24
    sizes = [g for p in kb.PROBLEMS for g in (p.eager_gib, p.compile_gib)]
    assert 13.5 < sum(sizes) / len(sizes) < 14.5  # the docstring's average
    cmds = kb.commands()
    assert len(cmds) == 32 and cmds == kb.commands()  # one fixed order, every time
    assert {(c.problem, c.variant) for c in cmds} == {
        (f, v) for f in files for v in ("eager", "compile")
    }
    assert [c.key for c in cmds] != [f"{f}:{v}" for f in files for v in ("eager", "compile")]
    assert {c.problem for c in kb.commands(kb.PROBLEMS[:3])} == set(files[:3])  # --subset


def test_populate_copies_the_listed_files_and_names_the_missing(kb: Any, tmp_path: Path) -> None:
    level1 = tmp_path / "KernelBench" / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    for p in kb.PROBLEMS[1:]:
        (level1 / p.file).write_text(f"# {p.file}\n")
    (level1 / "99_TripletMarginLoss.py").write_text("# not ours\n")
    dest = tmp_path / ".kb" / "problems"
    missing = kb.populate(tmp_path / "KernelBench", dest)
    assert missing == [kb.PROBLEMS[0].file]
    assert sorted(x.name for x in dest.iterdir()) == sorted(p.file for p in kb.PROBLEMS[1:])


def test_the_budget_is_shared_by_the_estimates(kb: Any) -> None:
    cmds = kb.commands()
    est = {m: kb.estimate_s(m, cmds) for m in ("exclusive", "krex8", "krex16")}
    assert est["exclusive"] == pytest.approx(16 * 5.0 + 16 * 14.0)
    assert est["krex8"] == pytest.approx(20 + est["exclusive"] / 4)
    assert sum(est.values()) < 540 - kb.RESERVE_S  # the default modes' estimate fits
    # The first mode's share of 100 s, 3:1 against the rest; the last mode gets all that is left.
    assert kb.share_deadline(1000.0, 1100.0, 300.0, 100.0) == pytest.approx(1075.0)
    assert kb.share_deadline(1000.0, 1100.0, 300.0, 0.0) == pytest.approx(1100.0)
    assert kb.share_deadline(1200.0, 1100.0, 300.0, 100.0) == pytest.approx(1200.0)  # past


def _mode(name: str, cpm: float, medians: dict[str, float], **krex: Any) -> dict[str, Any]:
    rows = []
    for key, ms in medians.items():
        problem, variant = key.split(":")
        row = {"problem": problem, "variant": variant, "status": "ok", "median_ms": ms}
        if key in krex:
            row["krex"] = krex[key]
        rows.append(row)
    slots = int(name[4:]) if name.startswith("krex") else None
    return {"mode": name, "slots": slots, "cmds_per_min_ok": cpm, "commands": rows}


def test_summary_throughput_percent_differences_and_the_native_repeat_rule(kb: Any) -> None:
    ex = _mode("exclusive", 2.0, {"a:eager": 1.0, "b:compile": 2.0, "c:eager": 4.0, "e:eager": 1})
    ex2 = _mode("exclusive2", 1.8, {"a:eager": 1.01, "b:compile": 2, "c:eager": 4, "e:eager": 1})
    clean = kb.krex_summary({"regions": [{"clean": True}]})
    unclean = kb.krex_summary({"regions": [{"clean": False, "problems": ["revoked"]}]})
    krex8 = _mode(
        "krex8",
        8.0,
        {"a:eager": 1.02, "b:compile": 2.004, "c:eager": 5.0, "e:eager": 1.0},
        **{"a:eager": clean, "b:compile": clean, "c:eager": unclean},  # e: no report
    )
    krex8["commands"].append({"problem": "d", "variant": "eager", "status": "oom"})
    doc = kb.summarise([ex, ex2, krex8])
    assert doc["native_spread_pct"]["a:eager"] == pytest.approx(1.0)
    assert krex8["throughput_vs_exclusive"] == pytest.approx(4.0)
    assert ex2["throughput_vs_exclusive"] == pytest.approx(0.9)
    a, b, c, e, d = krex8["commands"]
    assert a["diff_pct"] == pytest.approx(2.0) and a["off"]  # 2 % > 1 % spread + 0.3
    assert b["diff_pct"] == pytest.approx(0.2) and not b["off"]  # 0.2 % <= 0 % + 0.3
    assert c["diff_pct"] == pytest.approx(25.0) and "off" not in c  # unclean: not counted
    assert "diff_pct" not in d and e["diff_pct"] == 0 and "off" not in e  # e: no report
    assert (krex8["off"], krex8["off_of"]) == (1, 2)
    # The control: spreads a 1 %, b, c, e 0 %: 3 of 12 ordered pairs off, over 2 compared.
    assert krex8["off_if_native"] == 0.5
    assert krex8["diff_pct_abs_max"] == pytest.approx(25.0)
    assert "off" not in ex2 and ex2["diff_pct_abs_max"] == pytest.approx(1.0)
    # Without a native repeat the rule has nothing to go by, and says so.
    alone = _mode("krex16", 4.0, {"a:eager": 1.02}, **{"a:eager": clean})
    kb.summarise([_mode("exclusive", 2.0, {"a:eager": 1.0}), alone])
    assert alone["off"] == "no native repeat" and alone["diff_pct_abs_p50"] == pytest.approx(2.0)
    assert "no native repeat" in kb.table({"modes": [_counted(kb, alone)]})


def test_the_memory_time_ceiling_is_capacity_over_what_a_command_holds_alone(kb: Any) -> None:
    gib = 1 << 30
    ex = _mode("exclusive", 6.0, {"a:eager": 1.0, "b:compile": 2.0, "c:eager": 1.0})
    held = [(10, 1.0, 3.0), (30, 0.5, 10.5), (5, 2.0, None)]  # GiB, ready, timed (c: none)
    for r, (g, ready, timed) in zip(ex["commands"], held, strict=True):
        r["result"] = {"peak_bytes": g * gib, "t_ready_s": ready, "total_bytes": 100 * gib}
        if timed is not None:
            r["result"]["t_timed_s"] = timed
    ex["commands"].append(
        {
            "problem": "d",
            "variant": "eager",
            "status": "oom",
            "result": {"peak_bytes": 99 * gib, "t_ready_s": 0, "t_timed_s": 99},
        }
    )
    # a: 10 GiB x 2 s, b: 30 GiB x 10 s; a mean of 160 GiB x s: 100 GiB gives 37.5 a minute.
    c = kb.memory_time_ceiling([ex])
    assert c["commands"] == 2 and c["gib_s_per_command"] == pytest.approx(160.0)
    assert c["cmds_per_min"] == pytest.approx(37.5) and c["x_exclusive"] == pytest.approx(6.25)
    assert kb.memory_time_ceiling([ex], 200 * gib)["cmds_per_min"] == pytest.approx(75.0)
    krex8 = _mode("krex8", 24.0, {"a:eager": 1.0})
    krex8["commands"][0]["result"] = {"peak_bytes": 10 * gib, "t_ready_s": 1, "t_timed_s": 7}
    doc = kb.summarise([_counted(kb, ex), _counted(kb, krex8)])
    assert [c["mode"] for c in doc["memory_ceiling"]] == ["exclusive", "krex8"]
    assert doc["memory_ceiling"][1]["cmds_per_min"] == pytest.approx(100.0)  # 100 GiB / 60 GiB s
    assert "ceiling at exclusive's speeds: 37.5 commands a minute" in kb.table(doc)
    assert "ceiling at krex8's speeds: 100.0 commands a minute, 33.33x" in kb.table(doc)  # of 3
    # Records without the GPU's memory (before total_bytes), and no exclusive mode: no ceiling.
    for r in ex["commands"]:
        r["result"].pop("total_bytes", None)
    assert kb.memory_time_ceiling([ex]) is None and kb.memory_time_ceiling([]) is None


def _counted(kb: Any, mode: dict[str, Any]) -> dict[str, Any]:
    counted: dict[str, Any] = kb.counts(mode["commands"], 60.0)
    return mode | counted


def test_krex_reports_in_figures_old_and_new_fields(kb: Any) -> None:
    earlier = {
        "exit_code": 1,
        "preempted": True,
        "queue_s": 4.0,
        "memory": {"wait_s": 2.0, "waits": 3, "oom_shared": 1, "waits_by_kind": {"alloc": 2.0}},
        "regions": [{"clean": False, "revoked": True, "problems": ["the owner waited 5 s"]}],
    }
    rep = {
        "exit_code": 0,
        "pool": "warm",
        "queue_s": 0.5,
        "attempts": [earlier],
        "memory": {"peak_bytes": 8 << 30, "wait_s": 1.5, "waits": 1, "waits_by_kind": {"room": 1}},
        "regions": [
            {"clean": True, "candidate": True, "duration_s": 0.1},
            {"clean": False, "problems": ["drain timed out after 2 s"], "wait_s": 0.5},
        ],
    }
    k = kb.krex_summary(rep)
    assert (k["attempts"], k["preempted"], k["mem_wait_s"], k["mem_waits"]) == (1, 1, 3.5, 4)
    assert (k["regions"], k["unclean"], k["revoked"], k["drain_timeouts"]) == (3, 2, 1, 1)
    assert k["timing_clean"] is False  # the timing region (not the candidate's) is unclean
    assert k["waits_by_kind"] == {"alloc": 2.0, "room": 1.0} and k["oom_shared"] == 1
    assert k["peak_bytes"] == 8 << 30 and k["pool"] == "warm"
    assert k["queue_s"] == 4.5  # admission's waits, every attempt's
    old = kb.krex_summary({"exit_code": 0, "memory": {"wait_s": 0.25}, "regions": [{"clean": 1}]})
    assert (old["attempts"], old["preempted"], old["timing_clean"]) == (0, 0, True)
    assert "waits_by_kind" not in old and old["nvml_peak_bytes"] is None
    assert kb.krex_summary({})["timing_clean"] is False  # no region: not a clean timing
    # A region revoked for memory and its call timed again (`retaken`): its result was dropped,
    # the new region's kept (an H100, 2026-12-07: counted unclean before).
    revoked = {"clean": False, "revoked": True, "retaken": True, "problems": ["the owner waited"]}
    retake = kb.krex_summary({"exit_code": 0, "regions": [revoked, {"clean": True}]})
    assert (retake["timing_clean"], retake["unclean"], retake["retaken"]) == (True, 1, 1)
    assert kb.krex_summary({"regions": [revoked]})["timing_clean"] is False  # none kept
    memory_preempted = kb.krex_summary({"memory": {"preempted": "for room"}, "regions": []})
    assert memory_preempted["preempted"] == 1
    rows = [{"status": "ok", "krex": k}, {"status": "ok", "krex": old}, {"status": "not_run"}]
    c = kb.counts(rows, 30.0)
    assert (c["reruns"], c["preempted"], c["regions"], c["drain_timeouts"]) == (1, 1, 4, 1)
    assert c["mem_wait_p50_s"] == 3.5 and c["not_run"] == 1 and c["cmds_per_min_ok"] == 4.0
    assert c["queue_p95_s"] == 4.5


def test_a_mode_out_of_time_kills_what_runs_and_records_the_rest_not_run(
    kb: Any, tmp_path: Path
) -> None:
    """The hanging command is killed with its process group at the deadline; what comes after
    it is not started; every command's line is in the log; the others are classified."""
    cmds = [kb.Command(p, "eager") for p in ("ok_a", "oom_b", "bad_c", "hang_d", "ok_e")]
    out, log = tmp_path / "out", kb.Log(tmp_path / "commands.jsonl")
    t0 = time.monotonic()
    m = kb.run_mode("exclusive", cmds, fake_argv(tmp_path), out, tmp_path, t0 + 3.0, log)
    assert time.monotonic() - t0 < 3.0 + kb.KILL_GRACE_S + 5
    status = [r["status"] for r in m["commands"]]
    assert status == ["ok", "oom", "failed", "not_run", "not_run"]
    ok, oom, bad, hang, later = m["commands"]
    assert ok["median_ms"] == 1.5  # the last JSON line
    assert oom["error"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert bad["error"] == "error: RuntimeError: boom"
    assert hang["why"].startswith("budget (killed") and later["why"] == "budget (not started)"
    assert (m["ok"], m["failed"], m["oom"], m["not_run"]) == (1, 2, 1, 2)
    assert m["oom_errors"] == [f"oom_b eager: {oom['error']}"]
    grandchild = int((tmp_path / "grandchild").read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # killed with its group; reaped by init shortly after
            os.kill(grandchild, 0)
            time.sleep(0.05)
    lines = [json.loads(x) for x in (tmp_path / "commands.jsonl").read_text().splitlines()]
    assert sorted(x["index"] for x in lines) == [0, 1, 2, 3, 4]
    assert (out / "logs" / "exclusive" / "oom_b-eager.err").exists()
    # A mode whose deadline has passed starts nothing.
    late = kb.run_mode("shared8", cmds, fake_argv(tmp_path), out, tmp_path, t0, log)
    assert {r["why"] for r in late["commands"]} == {"budget (not started)"}
    assert late["not_run"] == 5 and late["cmds_per_min_ok"] == 0


@contextlib.contextmanager
def fake_daemon(tmp: Path, slots: int, tag: str = "", **kw: Any) -> Iterator[Path]:
    daemon_configs.append(kw.get("config", ""))
    yield tmp / f"krex-{slots}{'-' + tag if tag else ''}.sock"  # memory_check.daemon's names


daemon_configs: list[str] = []  # each fake daemon's configuration text


def faked_krex(
    kb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: Any
) -> tuple[list[Any], Any, Any]:
    """Two problems' commands through fake daemons and `run` in place of run_command: the
    commands, their argv and a log."""
    monkeypatch.setattr(kb.memory_check, "daemon", fake_daemon)
    monkeypatch.setattr(kb, "run_command", run)
    cmds = kb.commands(kb.PROBLEMS[:2])
    return cmds, kb.candidate(tmp_path / "problems"), kb.Log(tmp_path / "c.jsonl")


def clean_run(
    cmd: Any, argv: list[str], env: dict[str, str], logs: Path, deadline: float, value: str
) -> Any:
    """kb_memory.run_command's stand-in: the command ran through krex, its one region clean."""
    report = Path(argv[argv.index("--report") + 1])
    report.write_text(json.dumps({"exit_code": 0, "regions": [{"clean": True}]}))
    return {"rc": 0, "status": "ok", "median_ms": 1.0}


def test_krex_modes_run_each_command_through_krex_run_with_auto_regions(
    kb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []

    def fake_run(
        cmd: Any, argv: list[str], env: dict[str, str], logs: Path, deadline: float, value: str
    ) -> Any:
        seen.append(argv)
        assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
        return clean_run(cmd, argv, env, logs, deadline, value)

    cmds, argv_for, log = faked_krex(kb, tmp_path, monkeypatch, fake_run)
    m = kb.run_mode("krex16", cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60, log)
    assert m["ok"] == 4 and m["regions"] == 4 and m["unclean"] == 0 and m["slots"] == 16
    for argv in seen:
        run = argv.index("run")
        assert argv[run - 2 : run] == ["-m", "krex.cli"] and "--auto-regions" in argv
        assert argv[argv.index("--socket") + 1] == str(tmp_path / "krex-16.sock")
        cmd = argv[argv.index("--") + 1 :]
        assert cmd[1].endswith("scripts/bench/kb_candidate.py") and cmd[3] in ("eager", "compile")
        assert Path(cmd[2]).parent == tmp_path / "problems"
    # krex8-cold: a daemon of its own (another socket, so other learned peaks), commands cold.
    seen.clear()
    kb.run_mode("krex8-cold", cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60, log)
    assert {argv[argv.index("--socket") + 1] for argv in seen} == {
        str(tmp_path / "krex-8-cold.sock")
    }
    assert all("--no-pool" in argv for argv in seen)
    # krex1, krex1-cold, krex1-allcores: one at a time, daemons of one slot each; only the
    # allcores daemons (krex8-allcores too, of 8 slots) give the region every CPU (no pin).
    daemon_configs.clear()
    for name in ("krex1", "krex1-cold", "krex1-allcores", "krex8-allcores"):
        seen.clear()
        m = kb.run_mode(name, cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60, log)
        n = 8 if name.startswith("krex8") else 1
        assert (m["concurrency"], m["slots"], m["ok"]) == (n, n, 4)
        assert ("--no-pool" in seen[0]) == (name == "krex1-cold")
    assert {argv[argv.index("--socket") + 1] for argv in seen} == {
        str(tmp_path / "krex-8-allcores.sock")
    }
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    everything = f'[slices.0]\nregion = "{cpus}"\nshared = "{cpus}"\n'
    assert daemon_configs == ["", "", everything, everything]
    assert kb.all_cores_config([3, 1]) == '[slices.0]\nregion = "1,3"\nshared = "1,3"\n'
    # krex16-perslot: 16 slots with the headroom of before (half a GiB per slot, 8 in all),
    # its own daemon beside krex16's.
    daemon_configs.clear()
    seen.clear()
    m = kb.run_mode(
        "krex16-perslot", cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60, log
    )
    assert (m["slots"], m["ok"]) == (16, 4) and daemon_configs == ["[memory]\nheadroom_gib = 8\n"]
    assert {argv[argv.index("--socket") + 1] for argv in seen} == {
        str(tmp_path / "krex-16-perslot.sock")
    }


@pytest.mark.parametrize("name", ["exclusive-nvml", "exclusive-churn"])
def test_native_modes_run_beside_their_script_and_keep_its_record(
    kb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """exclusive-nvml and exclusive-churn: the commands natively (no krex run), their script
    (scripts/bench/nvml_poll.py; mem_churn.py, its processes each ready) started before them
    and stopped after; the mode keeps what it did (here no GPU: said so, nothing read or
    held)."""
    seen: list[list[str]] = []

    def fake_run(
        cmd: Any, argv: list[str], env: dict[str, str], logs: Path, deadline: float, value: str
    ) -> Any:
        seen.append(argv)
        return {"rc": 0, "status": "ok", "median_ms": 1.0}

    monkeypatch.setattr(kb, "run_command", fake_run)
    cmds = kb.commands(kb.PROBLEMS[:1])
    log = kb.Log(tmp_path / "c.jsonl")
    deadline = time.monotonic() + 120
    m = kb.run_mode(name, cmds, kb.candidate(tmp_path), tmp_path, tmp_path, deadline, log)
    assert (m["concurrency"], m["slots"], m["ok"]) == (1, None, 2)
    assert all("krex.cli" not in argv for argv in seen) and len(seen) == 2
    if name == "exclusive-nvml":
        p = m["nvml_poll"]
        assert p["period_s"] == kb.NVML_POLL_S and "churn" not in m
        if not p["nvml"]:  # no GPU here, as in CI: nothing read, and said so
            assert p["rounds"] == 0 and p["round_ms_p50"] is None
        assert json.loads((tmp_path / "nvml-exclusive-nvml.json").read_text()) == p
    else:
        c = m["churn"]
        assert c["procs"] == 7 and c["errors"] == [] and "nvml_poll" not in m
        if not c["cuda"]:
            assert c["rounds"] == 0 and c["held_gib_p50"] is None


def test_memory_churn_frees_and_makes_blocks_to_each_rounds_target() -> None:
    """One round of mem_churn: random blocks freed until under the target, then blocks of
    random sizes (64 MiB to 1 GiB, the last one cut to fit) made until at it."""
    import random

    churn = load_script("scripts/bench/mem_churn.py")
    made: list[int] = []
    blocks: list[Any] = []
    sizes: list[int] = []
    rng = random.Random(1)

    def make(n: int) -> int:
        made.append(n)
        return n

    churn.step(blocks, sizes, 3 << 30, make, rng)
    assert sum(sizes) == 3 << 30 and sizes == made and blocks == made
    assert all(n <= 1 << 30 for n in sizes) and all(n >= 64 << 20 for n in sizes[:-1])
    kept = list(sizes)
    churn.step(blocks, sizes, 1 << 30, make, rng)
    assert sum(sizes) == 1 << 30  # freed down to under 1 GiB, then made up to it
    assert len([n for n in sizes if n in kept]) < len(kept)
    with pytest.raises(SystemExit):
        churn.main(["--out", "x.json", "--procs", "0"])


def test_the_nvml_poller_reads_what_the_daemon_reads_until_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round: the clock sample, per-process memory, the process list and the work
    samples; SIGTERM ends it and it writes how many rounds ran and their seconds."""
    poll = load_script("scripts/bench/nvml_poll.py")
    calls: list[str] = []

    class FakeNvml:
        def __getattr__(self, name: str) -> Any:
            def read(*args: Any) -> None:
                calls.append(name)
                if name == "work_samples" and calls.count(name) == 3:
                    os.kill(os.getpid(), __import__("signal").SIGTERM)

            return read

    monkeypatch.setattr(poll.Nvml, "open", classmethod(lambda cls: FakeNvml()))
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert poll.main(["--out", str(tmp_path / "p.json"), "--period", "0.01"]) == 0
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    out = json.loads((tmp_path / "p.json").read_text())
    assert out["nvml"] and out["rounds"] == 3 and out["period_s"] == 0.01
    assert out["round_ms_p50"] is not None and out["round_ms_max"] >= out["round_ms_p50"]
    rounds = ["sample", "process_memory", "processes", "work_samples"]
    assert calls == rounds * 3 + ["close"]
    with pytest.raises(SystemExit):
        poll.main(["--out", str(tmp_path / "q.json"), "--period", "0"])


def test_a_whole_run_writes_its_json_and_ends_with_the_table(
    kb: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmds = [
        kb.Command("ok_a", "eager"),
        kb.Command("ok_b", "compile"),
        kb.Command("oom_c", "eager"),
    ]
    out = tmp_path / "r.json"
    names = ["exclusive", "exclusive2", "shared8"]
    doc = kb.run(names, cmds, fake_argv(tmp_path), out, tmp_path / "o", 120.0)
    assert json.loads(out.read_text())["partial"] and len(json.loads(out.read_text())["modes"]) == 3
    assert [m["mode"] for m in doc["modes"]] == names
    shared8 = doc["modes"][2]
    assert shared8["ok"] == 2 and shared8["oom"] == 1 and shared8["off"] == 0
    assert shared8["off_of"] == 2 and shared8["throughput_vs_exclusive"] > 0
    text = kb.table(doc)
    assert text.splitlines()[-1].startswith("shared8") and "+0.00%" in text
    assert "== exclusive2" in capsys.readouterr().out
    # An earlier run's native modes as the baseline of a later one.
    earlier = [m | {"from_baseline": "r.json"} for m in doc["modes"][:2]]
    again = kb.run(["shared8"], cmds, fake_argv(tmp_path), out, tmp_path / "o2", 60.0, earlier)
    assert [m["mode"] for m in again["modes"]] == names and again["modes"][2]["off"] == 0


def test_merge_summarises_one_or_more_calls_modes_first_come(kb: Any, tmp_path: Path) -> None:
    first = {"modes": [_counted(kb, _mode("exclusive", 2.0, {"a:eager": 1.0}))]}
    again = _counted(kb, _mode("exclusive", 9.0, {"a:eager": 5.0}))  # the first call's stands
    second = {"modes": [again, _counted(kb, _mode("exclusive2", 2.0, {"a:eager": 1.02}))]}
    paths = [tmp_path / "1.json", tmp_path / "2.json"]
    for p, d in zip(paths, (first, second), strict=True):
        p.write_text(json.dumps(d))
    out = tmp_path / "m.json"
    assert kb.merge(paths, out) == 0
    doc = json.loads(out.read_text())
    assert [(m["mode"], m["from_call"]) for m in doc["modes"]] == [
        ("exclusive", str(paths[0])),
        ("exclusive2", str(paths[1])),
    ]
    assert doc["native_spread_pct"]["a:eager"] == pytest.approx(2.0)
    assert kb.merge(paths[:1], out) == 0  # one call's alone: summarised again
    assert [m["mode"] for m in json.loads(out.read_text())["modes"]] == ["exclusive"]


def test_a_mode_run_again_knows_the_first_runs_peaks_and_the_tables_say_so(
    kb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mode named twice in one run: its second daemon (same socket) starts knowing every peak
    the first learned (the H100's krex8 then ran 47 against 28 commands a minute); the record
    counts them, and the table and a merge keep both runs apart."""
    cmds, argv_for, log = faked_krex(kb, tmp_path, monkeypatch, clean_run)
    first = kb.run_mode("krex8", cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60, log)
    assert first["peaks_known"] == 0  # a fresh daemon: no peaks file yet
    peaks = tmp_path / "krex-8.sock.peaks.json"  # what the daemon writes as commands end
    peaks.write_text(json.dumps({f"{i:032x}": (i + 1) << 30 for i in range(4)}))
    again = kb.run_mode("krex8", cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60, log)
    assert again["peaks_known"] == 4
    other = kb.run_mode("krex16", cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60, log)
    assert other["peaks_known"] == 0  # another name, another daemon's peaks
    peaks.write_text("{not json")
    assert kb.peaks_known(tmp_path / "krex-8.sock") is None

    doc = kb.summarise([first, again, other])
    text = kb.table(doc)
    assert kb.mode_labels(doc["modes"]) == ["krex8", "krex8#2", "krex16"]
    rows = {line.split()[0]: line.split() for line in text.splitlines()[-3:]}
    assert rows["krex8"][1] == "0" and rows["krex8#2"][1] == "4" and rows["krex16"][1] == "0"
    header = next(line for line in text.splitlines() if line.startswith("command"))
    assert header.split()[-3:] == ["krex8", "krex8#2", "krex16"]
    # A merge keeps a call's repeated mode; a later call's krex8 still yields to the first's.
    paths = [tmp_path / "1.json", tmp_path / "2.json"]
    paths[0].write_text(json.dumps(doc))
    paths[1].write_text(json.dumps({"modes": [again | {"cmds_per_min_ok": 99.0}]}))
    assert kb.merge(paths, tmp_path / "m.json") == 0
    merged = json.loads((tmp_path / "m.json").read_text())["modes"]
    assert [(m["mode"], m["from_call"]) for m in merged] == [
        ("krex8", str(paths[0])),
        ("krex8", str(paths[0])),
        ("krex16", str(paths[0])),
    ]


@pytest.mark.parametrize("file", ["same", "new"])
def test_agents_run_their_candidates_one_after_another_each_written_before_it_runs(
    kb: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file: str
) -> None:
    """krex8-agents (-new): 8 agents at once, each on one problem, its 4 candidates in turn,
    each its problem's file with a line of its own, at one path (bench.py, a family) or a new
    one each time."""
    problems = tmp_path / "problems"
    problems.mkdir()
    cmds = kb.commands(kb.PROBLEMS[:5])  # 10 commands: the agents take the first 8
    for c in cmds:
        (problems / c.problem).write_text(f"# {c.problem}\n")
    seen: list[tuple[str, str, str]] = []  # (agent's candidate, its file, its text)

    def fake_run(
        cmd: Any, argv: list[str], env: dict[str, str], logs: Path, deadline: float, value: str
    ) -> Any:
        path = Path(argv[argv.index("--") + 3])  # python kb_candidate.py PROBLEM VARIANT
        seen.append((cmd.agent, str(path), path.read_text()))
        return clean_run(cmd, argv, env, logs, deadline, value)

    monkeypatch.setattr(kb.memory_check, "daemon", fake_daemon)
    monkeypatch.setattr(kb, "run_command", fake_run)
    log = kb.Log(tmp_path / "c.jsonl")
    name = "krex8-agents" if file == "same" else "krex8-agents-new"
    m = kb.run_mode(name, cmds, kb.candidate(problems), tmp_path / "o", tmp_path,
                    time.monotonic() + 60, log)  # fmt: skip
    assert m["ok"] == 32 and len(seen) == 32
    rows = {r["agent"]: r for r in m["commands"]}
    assert all(rows[f"a{a}c{j}"]["candidate"] == j for a in range(8) for j in range(4))
    for a in range(8):
        mine = [(agent, path, text) for agent, path, text in seen if agent.startswith(f"a{a}c")]
        assert [agent for agent, _, _ in mine] == [f"a{a}c{j}" for j in range(4)]  # in turn
        assert all(text.startswith(f"# {cmds[a].problem}\n") for _, _, text in mine)
        assert len({text for _, _, text in mine}) == 4  # another command each time
        paths = {path for _, path, _ in mine}
        assert len(paths) == (1 if file == "same" else 4)
        assert all(Path(p).parent.name == f"agent{a}" for p in paths)
    with pytest.raises(ValueError, match="problems' directory"):
        kb.run_mode(name, cmds, lambda c: ["x"], tmp_path / "o2", tmp_path,
                    time.monotonic() + 60, log)  # fmt: skip


def test_an_agents_candidate_is_compared_with_its_problem_and_has_its_own_row(kb: Any) -> None:
    """An agent's candidate (its own path) is timed against the problem it copies, and each
    candidate j is one row in every agent mode, whichever file it was written to."""
    ex = _mode("exclusive", 2.0, {"p.py:eager": 1.0})
    ex2 = _mode("exclusive2", 2.0, {"p.py:eager": 1.0})
    clean = kb.krex_summary({"regions": [{"clean": True}]})
    modes = [_counted(kb, ex), _counted(kb, ex2)]
    for name, file in (("krex8-agents", "same"), ("krex8-agents-new", "new")):
        rows = []
        for j in range(2):
            path = f"/tmp/{name}/agent0/{kb.memory_check.agent_script(j, file)}"
            ms = 1.1 if j else 1.0
            rows.append({"problem": path, "variant": "eager", "agent": f"a0c{j}", "of": "p.py",
                         "candidate": j, "status": "ok", "median_ms": ms,
                         "krex": clean})  # fmt: skip
        modes.append(_counted(kb, {"mode": name, "slots": 8, "cmds_per_min_ok": 3.0,
                                   "commands": rows}))  # fmt: skip
    doc = kb.summarise(modes)
    for m in modes[2:]:
        c0, c1 = m["commands"]
        assert c0["diff_pct"] == pytest.approx(0.0) and not c0["off"]
        assert c1["diff_pct"] == pytest.approx(10.0) and c1["off"]
        assert (m["off"], m["off_of"]) == (1, 2)
    lines = kb.table(doc).splitlines()
    assert [ln.split()[:3] for ln in lines[1:4]] == [
        ["p", "eager", "-"], ["p", "eager", "c0"], ["p", "eager", "c1"]
    ]  # fmt: skip
    assert lines[3].split()[-2:] == ["+10.00%!", "+10.00%!"]  # both agent modes, one row

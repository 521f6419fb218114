"""scripts/bench/memory_check.py's running of its mix (the GPU runs themselves are in
docs/results/h200-memory/): on a node of two GPUs, the mix on each GPU at once, the mode's
concurrency on each, counted per GPU."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import load_script


def test_with_two_gpus_each_runs_the_mix_at_the_modes_concurrency(tmp_path: Path) -> None:
    check = load_script("scripts/bench/memory_check.py")
    lock = threading.Lock()
    running = {0: 0, 1: 0}
    most = {0: 0, 1: 0}

    def fake_run_one(size: float, variant: str, sock: Any, cache: Path, report: Path,
                     retry: bool = True, gpu: int | None = None,
                     extra_env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
        assert gpu in (0, 1, None) and sock is None and not extra_env  # shared8: natively
        g = gpu or 0  # None: a node of one GPU
        with lock:
            running[g] += 1
            most[g] = max(most[g], running[g])
        time.sleep(0.05)
        with lock:
            running[g] -= 1
        oom = gpu == 1 and size == 40  # GPU 1's two largest die of out-of-memory
        return {"size_gib": size, "variant": variant, "rc": 1 if oom else 0, "oom": oom,
                "median_ms": 1.0, **({} if gpu is None else {"gpu": gpu})}  # fmt: skip

    check.run_one = fake_run_one
    m = check.run_mode("shared8", tmp_path, gpus=2)
    assert len(m["commands"]) == 24 and (m["succeeded"], m["oom"]) == (22, 2)
    assert (m["per_gpu"]["0"]["succeeded"], m["per_gpu"]["0"]["oom"]) == (12, 0)
    assert (m["per_gpu"]["1"]["succeeded"], m["per_gpu"]["1"]["oom"]) == (10, 2)
    assert most == {0: 8, 1: 8}  # 8 at once on each GPU, not 8 in all
    # Inflation against the same GPU's exclusive run of the same candidate.
    base = {"mode": "exclusive", "cmds_per_min_ok": 1.0, "commands": m["commands"]}
    doc = check.summarise([base | {"commands": [c | {"median_ms": 2.0} for c in m["commands"]]},
                           m | {"cmds_per_min_ok": 1.0}])  # fmt: skip
    assert doc["modes"][1]["inflation_max"] == pytest.approx(0.5)
    one = check.run_mode("shared8", tmp_path, gpus=1)
    assert "per_gpu" not in one and len(one["commands"]) == 12


def test_no_gpus_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    check = load_script("scripts/bench/memory_check.py")
    argv = ["memory_check.py", "--json", str(tmp_path / "m.json"), "--gpus", "0"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        check.main()
    assert e.value.code == 2 and "--gpus must be 1 or more, not 0" in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("sock", [None, Path("/run/k.sock")])
def test_a_candidate_is_sent_to_its_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sock: Path | None
) -> None:
    """Natively by CUDA_VISIBLE_DEVICES (in bus order), under krex by `krex run --gpu`."""
    check = load_script("scripts/bench/memory_check.py")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    seen: dict[str, Any] = {}

    def fake_run(argv: list[str], env: dict[str, str], **kw: Any) -> Any:
        seen.update(argv=argv, env=env)
        return SimpleNamespace(returncode=0, stdout='{"median_ms": 1.5}\n', stderr="")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    out = check.run_one(8, "eager", sock, tmp_path / "c", tmp_path / "r.json", gpu=1)
    assert out["gpu"] == 1 and out["median_ms"] == 1.5 and out["rc"] == 0
    if sock is None:
        assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "1"
        assert seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "krex.cli" not in seen["argv"]
    else:  # krex picks the GPU: the command sees the node as it is
        i = seen["argv"].index("--gpu")
        assert seen["argv"][i + 1] == "1" and seen["argv"].index("--") > i
        assert "CUDA_VISIBLE_DEVICES" not in seen["env"]


def test_shared8_mps_runs_every_command_as_a_client_of_its_own_mps_daemon(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The native MPS mode starts an MPS daemon for the mode, hands its variables to every
    command, and stops it after the mode, failed commands or not."""
    import krex.daemon.mps

    check = load_script("scripts/bench/memory_check.py")
    events: list[str] = []

    class FakeMps:
        @classmethod
        def start(cls, directory: Path) -> FakeMps:
            events.append(f"start {directory.name}")
            return cls()

        def env(self) -> dict[str, str]:
            return {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/pipe"}

        def stop(self) -> None:
            events.append("stop")

    def fake_run_one(*a: Any, extra_env: dict[str, str] | None = None, **k: Any) -> dict[str, Any]:
        assert extra_env == {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/pipe"}, extra_env
        return {"size_gib": a[0], "variant": a[1], "rc": 0, "oom": False}

    monkeypatch.setattr(krex.daemon.mps, "Mps", FakeMps)
    check.run_one = lambda *a: fake_run_one(*a[:7], extra_env=a[7])
    m = check.run_mode("shared8-mps", tmp_path)
    assert m["succeeded"] == 12 and events == ["start mps-shared8-mps", "stop"]

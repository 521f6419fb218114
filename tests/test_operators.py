"""What operators use: `krex config show`, `krex status` and `krex top`, the Prometheus endpoint,
JSON logs, and the deployment files in docs/deploy/ (the unit verifies, the manifests parse, the
example configuration is accepted)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import HOLDER, KREX, Daemon, krex_run

from krex.core.config import from_toml, load
from krex.daemon.metrics import NAMES

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "docs" / "deploy"


def test_config_show_prints_a_configuration_the_daemon_accepts(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[gpus]\nslots = 3\n[pool]\nworkers = 2\n[regions]\nsettle_s = 0.25\n")
    p = subprocess.run([*KREX, "config", "show", "--sim", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    again = from_toml(p.stdout, "shown")
    assert (again.slots, again.pool_workers, again.sim) == (3, 2, True)
    assert again.region_settle_s == 0.25
    assert 0 in again.slices, "the derived core slices are spelled out"
    shown = subprocess.run([*KREX, "config", "show", "--sim", "--json", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    j = json.loads(shown.stdout)
    assert j["gpus"]["count"] == 1 and j["pool"]["workers"] == 2 and j["slices"]["0"]["region"]
    cfg.write_text("[gpus]\nslots = 0\n")
    bad = subprocess.run([*KREX, "config", "show", "--sim", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "gpus.slots must be 1..256" in bad.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_top_metrics_and_json_logs(tmp_path: Path) -> None:
    port = _free_port()
    d = Daemon(tmp_path / "krex.sock", "--metrics-port", str(port), "--log-format", "json")
    d.start()
    try:
        holder = krex_run(d, sys.executable, "-c", HOLDER, "1.5", stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline().startswith("in region")
        st = d.status()
        assert st is not None
        tenant = st["gpus"][0]["region"]["tenant"]
        for cmd in (["status"], ["top", "--once"]):
            p = subprocess.run([*KREX, *cmd, "--socket", str(d.socket)], capture_output=True,
                               text=True, timeout=60)  # fmt: skip
            assert p.returncode == 0, p.stderr
            assert "region (tenant, age)" in p.stdout and "regions/min" in p.stdout, p.stdout
            assert f"{tenant}, " in p.stdout and "tenants" in p.stdout, p.stdout
        assert holder.wait(timeout=30) == 0
        time.sleep(1.2)  # the gauges are refreshed every second
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        lines = text.decode().splitlines()
        for name in NAMES:
            assert any(line.startswith(name) for line in lines), name
        assert 'krex_regions_total{gpu="0"} 1.0' in lines
        assert 'krex_starts_total{gpu="0",pool="cold"} 1.0' in lines
        recent = d.status()["gpus"][0]["recent"]  # type: ignore[index]
        assert recent["regions"] == 1 and recent["wait_ms_p50"] is not None
    finally:
        d.stop()
    logged = [line for line in d.log.read_text().splitlines() if line.strip()]
    docs = [json.loads(line) for line in logged]
    assert all({"ts", "level", "logger", "msg"} <= set(doc) for doc in docs)
    assert any("region of tenant" in doc["msg"] for doc in docs)


def test_the_operator_guide_lists_every_metric() -> None:
    guide = (ROOT / "docs" / "operator-guide.md").read_text()
    for name in NAMES:
        assert f"`{name}" in guide, name


def test_deployment_files() -> None:
    cfg = load(DEPLOY / "config.toml")
    assert cfg.socket == Path("/run/krex/krex.sock")
    yaml = pytest.importorskip("yaml")
    kinds = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        kinds += [doc["kind"] for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert "DaemonSet" in kinds and "ConfigMap" in kinds


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (DEPLOY / "krex.service").read_text()
    # The test machine has no /usr/local/bin/krex: verify the unit with a binary that exists.
    unit = unit.replace("/usr/local/bin/krex", "/bin/true")
    (tmp_path / "krex.service").write_text(unit)
    p = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "krex.service")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [
        line
        for line in (p.stdout + p.stderr).splitlines()
        if "krex.service" in line and "Failed to" not in line
    ]
    assert p.returncode == 0 or not problems, p.stdout + p.stderr

"""docs/deploy/ is checked with the tools made for it (issue #19): the systemd unit with
`systemd-analyze verify` where systemd is present, the Kubernetes manifests against the
Kubernetes schemas (kubernetes-validate), and the example configuration with krex's own loader."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from krex.core.config import load

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    """As installed: its ExecStart pointed at this environment's krex (the unit names
    /usr/local/bin/krex, which a development machine need not have)."""
    krex = Path(sys.executable).parent / "krex"
    assert krex.exists(), krex
    unit = (DEPLOY / "krex.service").read_text()
    assert "ExecStart=/usr/local/bin/krex " in unit
    installed = tmp_path / "krex.service"
    installed.write_text(unit.replace("ExecStart=/usr/local/bin/krex ", f"ExecStart={krex} "))
    p = subprocess.run(
        ["systemd-analyze", "verify", str(installed)], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr


@pytest.mark.parametrize("manifest", sorted((DEPLOY / "kubernetes").glob("*.yaml")), ids=str)
def test_the_kubernetes_manifests_validate(manifest: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", str(manifest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_example_configuration_loads() -> None:
    cfg = load(DEPLOY / "config.toml")
    assert cfg.source.endswith("config.toml")

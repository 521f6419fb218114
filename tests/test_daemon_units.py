"""Pieces of the controller that need no daemon running."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest
from conftest import ROOT, remove_shm, unique

from krex.core.config import ConfigError, from_toml
from krex.sim import simnode


def test_sim_lock_offsets_are_the_ones_krexsim_h_documents() -> None:
    """The daemon reads the simulated node's lock holders where shim/sim/krexsim.h says."""
    header = (ROOT / "shim" / "sim" / "krexsim.h").read_text()
    defs = {k: int(v) for k, v in re.findall(r"#define (KREXSIM_\w+_OFFSET) (\d+)", header)}
    assert (
        defs["KREXSIM_MODEL_HOLDER_OFFSET"],
        defs["KREXSIM_CTX_HOLDER_OFFSET"],
    ) == simnode.HOLDER_OFFSETS
    assert (
        defs["KREXSIM_MODEL_LOCK_OFFSET"],
        defs["KREXSIM_CTX_LOCK_OFFSET"],
    ) == simnode.LOCK_OFFSETS


def test_sim_lock_holders_reads_holder_pids_and_lock_owner_threads() -> None:
    """A holder pid field and a robust mutex's owner thread id both name the holding process."""
    name = unique("krex-simlock")
    path = Path("/dev/shm") / name.lstrip("/")
    head = bytearray(128)
    head[32:36] = (12345).to_bytes(4, "little")  # model lock holder (a pid)
    head[80:84] = (threading.get_native_id() | 0x80000000).to_bytes(4, "little")  # waiters bit
    path.write_bytes(bytes(head))
    try:
        assert simnode.lock_holders(name) == {12345, os.getpid()}
        path.write_bytes(bytes(128))
        assert simnode.lock_holders(name) == set()
    finally:
        remove_shm(name)
    assert simnode.lock_holders("/krex-no-such-sim") == set()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
@pytest.mark.parametrize("key", ["quiesce_s", "drain_s", "freeze_s", "region_s"])
def test_non_finite_time_outs_are_one_error_naming_the_key(key: str, value: str) -> None:
    """A time-out of nan or inf used to be accepted, and every region then failed."""
    with pytest.raises(ConfigError, match=rf"timeouts\.{key} must be > 0 and finite"):
        from_toml(f"[timeouts]\n{key} = {value}\n", "t.toml")


@pytest.mark.parametrize("key", ["settle_s", "capped_settle_s"])
@pytest.mark.parametrize("value", ["nan", "inf", "-0.1", "5.5"])
def test_a_settle_outside_0_to_5_seconds_is_one_error(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"regions\.{key} must be 0\.\.5 \(seconds\)"):
        from_toml(f"[regions]\n{key} = {value}\n", "t.toml")
    assert from_toml("[regions]\nsettle_s = 0.4\n", "t.toml").region_settle_s == 0.4
    assert from_toml("", "t.toml").region_settle_s == 0.0
    cfg = from_toml("[regions]\ncapped_settle_s = 0\n", "t.toml")
    assert cfg.region_capped_settle_s == 0.0
    assert from_toml("", "t.toml").region_capped_settle_s == 2.0

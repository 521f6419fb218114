"""Configuration that passes validation must be one the daemon can run with (issue #50, item 6).

Every numeric setting is range-checked against what krex can hold: a gate's deadline and the
shim's waits are nanoseconds in 64 bits, Python's timers and sockets hold about 9.2e9 s, a byte
count becomes an int. `region_s = 1e12` used to pass and break every region (OverflowError in
the daemon, the client saw its connection closed); `headroom_gib = 1e300` a traceback at the
start. Out of range is one ConfigError naming the key, its value and the range; a fuzz target
(bounded example count) shows the loader never raises anything else, and that what it accepts
is representable. The same bounds hold for the equivalent flags (krex run --mem,
--region-timeout) and for KREX_SIM_MEM_BYTES, which the daemon reads as the simulated driver
does.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import HOLDER, KREX, configured, krex_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from krex.core.config import (
    _FIELDS,
    _SCHEMA,
    MAX_BYTES,
    MAX_SECONDS,
    Config,
    ConfigError,
    from_toml,
    sim_mem_bytes,
)
from krex.daemon.regions import GATE_GRACE_S

DURATIONS = [("timeouts", k) for k in ("quiesce_s", "drain_s", "freeze_s", "region_s")] + [
    ("memory", k) for k in ("wait_s", "deadlock_s", "room_wait_s")
]
SIZES = [("memory", k) for k in ("headroom_gib", "room_gib", "unknown_gib")]
INTS = [("gpus", "count"), ("gpus", "slots"), ("pool", "workers"), ("pool", "max_uses"),
        ("metrics", "port")]  # fmt: skip
# Out of range, and how the error shows each value.
TOO_LARGE = {"1e12": "got 1000000000000.0", "1e300": "got 1e+300", "inf": "got inf",
             "nan": "got nan", "-1": "got -1", "9" * 400: "got 99999"}  # fmt: skip


def _doc(section: str, key: str, value: str) -> str:
    return f"[{section}]\n{key} = {value}\n"


@pytest.mark.parametrize("section,key", DURATIONS + SIZES)
@pytest.mark.parametrize("value", TOO_LARGE)
def test_every_number_out_of_range_is_one_error_naming_key_value_and_range(
    section: str, key: str, value: str
) -> None:
    with pytest.raises(ConfigError) as e:
        from_toml(_doc(section, key, value), "c.toml")
    msg = str(e.value)
    assert msg.startswith(f"c.toml: {section}.{key} must be "), msg
    assert "at most" in msg and "got " in msg and "\n" not in msg, msg
    assert TOO_LARGE[value] in msg, msg


@pytest.mark.parametrize("section,key", INTS)
def test_integers_too_large_for_anything_are_refused(section: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"{section}\.{key} must be .*got 9999"):
        from_toml(_doc(section, key, "9" * 30))


def test_a_cpu_list_of_a_trillion_cpus_is_refused_not_built() -> None:
    with pytest.raises(ConfigError, match=r"slices\.0\.region: .*CPUs are 0\.\.8191"):
        from_toml('[slices.0]\nregion = "0-99999999999"\nshared = "1"\n')
    with pytest.raises(ConfigError, match=r"the key must be a GPU index"):
        from_toml('[slices."²"]\nregion = "0"\nshared = "1"\n')


def test_a_segment_name_the_cgroups_or_dev_shm_cannot_take_is_refused() -> None:
    for bad in ("/a b", "/" + "é" * 150, "/.", "/..", "/-x"):
        with pytest.raises(ConfigError, match=r"daemon\.segment must look like"):
            from_toml(f'[daemon]\nsegment = "{bad}"\n')


def test_krex_config_show_and_the_daemon_say_it_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[timeouts]\nregion_s = 1e12\n")
    for argv in (["config", "show"], ["daemon", "--sim", "--socket", str(tmp_path / "k.sock")]):
        p = subprocess.run(
            [*KREX, *argv],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KREX_CONFIG": str(cfg)},
        )
        assert p.returncode == 2, p.stderr
        line = p.stderr.strip().splitlines()[-1]
        assert "timeouts.region_s must be > 0 and finite, at most 1e+09" in line
        assert "got 1000000000000.0" in line and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "text,ok",
    [("80G", 80 << 30), ("1M", 1 << 20), ("512kB", None), ("1P", None), ("1.5G", None),
     ("2048T", None), ("1024TiB", 1 << 50), ("99999999999999999999999", None), ("", None)],
)  # fmt: skip
def test_the_daemon_reads_krex_sim_mem_bytes_as_the_simulated_driver(
    text: str, ok: int | None
) -> None:
    if ok is None:
        with pytest.raises(ConfigError, match=r"KREX_SIM_MEM_BYTES=.*between 1 MiB and 1 PiB"):
            sim_mem_bytes(text)
    else:
        assert sim_mem_bytes(text) == ok


def test_a_daemon_given_a_sim_memory_the_driver_would_ignore_refuses_to_start(
    tmp_path: Path,
) -> None:
    p = subprocess.run(
        [*KREX, "daemon", "--sim", "--socket", str(tmp_path / "k.sock")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KREX_SIM_MEM_BYTES": "1.5G"},
    )
    assert p.returncode == 2 and "KREX_SIM_MEM_BYTES='1.5G'" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "flag,value,says",
    [
        ("--mem", "1e300", "at most 1024T"),
        ("--mem", "2048T", "at most 1024T"),
        ("--region-timeout", "1e12", "at most 1e+09"),
        ("--queue-timeout", "1e300", "at most 1e+09"),
    ],
)
def test_the_equivalent_flags_have_the_same_bounds(flag: str, value: str, says: str) -> None:
    p = subprocess.run(
        [*KREX, "run", "--sim", "--socket", "/nonexistent/k.sock", flag, value, "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


# --- the fuzz target ---------------------------------------------------------------------------

values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-300, max_value=300).map(lambda e: 10**e if e >= 0 else -(10**-e)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 5e-324, 1e9, 1e9 + 1, 1048576.0, 1048577.0, 65535, 65536, 256, 257]),
    st.text(max_size=30),
    st.sampled_from(["text", "json", "auto", "nvidia", "amd", "signal", "/krex-x", "0-3", "1"]),
    st.lists(st.sampled_from(["torch", "os", "a.b", "1x", ""]), max_size=3),
)


def _toml(v: Any) -> str:
    """A TOML value (floats as TOML spells them: nan, inf)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        kept = (c for c in v if not 0xD800 <= ord(c) <= 0xDFFF)  # TOML has no surrogates
        return '"' + "".join(c if c.isalnum() or c in " ./-_" else f"\\U{ord(c):08x}" for c in kept) + '"'  # noqa: E501  # fmt: skip
    return "[" + ", ".join(_toml(x) for x in v) + "]"


def _nest(pairs: list[tuple[tuple[str, str], Any]]) -> dict[str, dict[str, Any]]:
    doc: dict[str, dict[str, Any]] = {}
    for (section, key), value in pairs:
        doc.setdefault(section, {})[key] = value
    return doc


documents = st.lists(st.tuples(st.sampled_from(sorted(_FIELDS)), values), max_size=8).map(_nest)


def _render(doc: dict[str, dict[str, Any]]) -> str:
    return "".join(
        f"[{section}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in body.items())
        for section, body in doc.items()
    )


def _runnable(cfg: Config) -> None:
    """What the daemon does with the numbers of a config it accepted, each representable."""
    from krex.core.shm import _ns

    u64 = 2**64 - 1
    for section, key in DURATIONS:
        seconds = getattr(cfg, _FIELDS[section, key])
        assert 0 < seconds <= MAX_SECONDS
        # A gate's deadline (now + region_s + grace, in ns) and the shim's waits: uint64.
        assert _ns(seconds + GATE_GRACE_S) + 2**62 < u64
    bound = cfg.quiesce_timeout_s + cfg.drain_timeout_s + cfg.freeze_timeout_s + 5.0
    assert bound < 9.2e9  # the shutdown's asyncio bound: Python's time limit
    wait = float(f"{cfg.memory_wait_s:g}")  # KREX_MEM_WAIT_S as the shim reads it
    assert 0 <= wait <= 1e9
    for capacity in (0, 80 << 30, MAX_BYTES):
        for b in (cfg.headroom_bytes(), cfg.headroom_each_bytes(), cfg.room_bytes(capacity),
                  cfg.unknown_bytes(capacity)):  # fmt: skip
            assert isinstance(b, int) and 0 <= b <= MAX_BYTES
    assert 0 <= cfg.metrics_port <= 65535 and 1 <= cfg.slots <= 256
    for s in cfg.slices.values():
        assert max(s.region | s.shared, default=0) <= 8191
    cfg.segment_name()


@settings(
    max_examples=int(os.environ.get("KREX_FUZZ_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(doc=documents)
def test_the_loader_accepts_what_the_daemon_can_run_or_says_why_in_one_error(
    doc: dict[str, dict[str, Any]],
) -> None:
    text = _render(doc)
    try:
        cfg = from_toml(text, "fuzz.toml")
    except ConfigError as e:
        assert str(e).startswith("fuzz.toml: ") and "\n" not in str(e).strip(), str(e)
        return
    _runnable(cfg)


@given(section=st.sampled_from(sorted(_SCHEMA)), raw=st.text(max_size=200))
@settings(max_examples=int(os.environ.get("KREX_FUZZ_EXAMPLES", "400")), deadline=None)
def test_random_text_is_a_config_or_one_config_error(section: str, raw: str) -> None:
    for text in (raw, f"[{section}]\n{raw}"):
        with contextlib.suppress(ConfigError):
            _runnable(from_toml(text, "fuzz.toml"))


def test_a_daemon_with_every_limit_at_its_largest_runs_regions(tmp_path: Path) -> None:
    """The accepted extremes, end to end: a region is granted and ends, the command exits 0."""
    config = (
        "[timeouts]\n"
        + "".join(f"{k} = 1e9\n" for k in ("quiesce_s", "drain_s", "freeze_s", "region_s"))
        + "[memory]\nwait_s = 1e9\ndeadlock_s = 1e9\nroom_wait_s = 1e9\n"
        + "headroom_gib = 1048576\nunknown_gib = 1048576\n"
        + "[regions]\nsettle_s = 5\ncapped_settle_s = 5\n"
        + "[pool]\nmax_uses = 2147483647\n"
    )
    with configured(tmp_path, config) as d:
        report = tmp_path / "r.json"
        p = krex_run(d, sys.executable, "-c", HOLDER, "0.1", report=report, stdout=subprocess.PIPE)
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, d.log.read_text()[-3000:]
        assert "in region" in out and "out" in out
        assert "Traceback" not in d.log.read_text()

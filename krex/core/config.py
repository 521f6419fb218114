"""The controller's configuration: TOML, validated, with defaults derived from the machine.

Looked up in this order: the `--config` flag, `$KREX_CONFIG`, `/etc/krex/config.toml`; without
any, the embedded defaults. Every bad key or value is one `ConfigError` naming it.

Each setting is one field of `Config`, whose `Key` says where it is in the file (`[memory]
room_wait_s`), what it takes, its bounds and what it means. The parser, its type checks,
`validate`, `krex config show` (krex/daemon/views.py) and the operator guide's table of settings
(`keys_table`, written by scripts/config_table.py) are all derived from those fields. An example
file: docs/deploy/config.toml.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from krex.core.errors import KrexError
from krex.core.slices import MAX_CPU, SliceError, parse_cpu_list

DEFAULT_PATH = Path("/etc/krex/config.toml")
# A unix socket's path has at most 107 bytes (sun_path, with its NUL); a segment's name becomes a
# file in /dev/shm (NAME_MAX 255) with suffixes of its own added (`-t<tenant>`, `-sim`).
SOCKET_PATH_MAX = 107
SEGMENT_NAME_MAX = 200
# Its name without the slash is also the daemon's cgroup root (krex/core/tenants.py, _ROOT_NAME).
_SEGMENT_NAME = re.compile(rf"/[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{SEGMENT_NAME_MAX - 1}}}")
FREEZERS = ("auto", "cgroup-v2", "cgroup-v1", "signal")
VENDORS = ("auto", "nvidia", "amd")
# A region's settle (regions.settle_s, krex run --settle): its longest. Siblings stay frozen
# through it, so a long one would cost everyone; 5 s is past any cooling measured to matter.
MAX_SETTLE_S = 5.0
MAX_PACE_MS = 1000.0  # pacing (regions.pace_ms): beyond a second it bounds nothing a drain feels
# The longest time-out of any kind (about 31 years): a gate's deadline and the shim's waits are
# nanoseconds in 64 bits, Python's sockets and timers hold at most about 9.2e9 s, and several
# time-outs are added up (a region's setup, the shutdown's bound). The shim caps its own waits
# (KREX_MEM_WAIT_S, KREX_REGION_WAIT_S) here too.
MAX_SECONDS = 1e9
# The most device memory any setting or flag names (memory.*_gib, krex run --mem), 1 PiB: far
# beyond any GPU, and what the simulated driver takes (KREX_SIM_MEM_BYTES, shim/sim).
MAX_BYTES = 1 << 50
MAX_GIB = MAX_BYTES >> 30
MAX_EXACT_INT = 2**53  # an integer given for a number: at most this large
MAX_GPUS = 16  # gpus.count, slices.N, krex daemon --gpus
MAX_POOL_USES = 2**31 - 1  # pool.max_uses (unused, but still a number krex can hold)


class ConfigError(KrexError):
    """A configuration file or value that cannot be used."""


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'24G', '512M', '1.5T', '1073741824' -> bytes (K/M/G/T are powers of 1024; 'iB' and 'B'
    suffixes are accepted). ValueError for anything else."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _SIZE_UNITS and t[-1:] else ""
    number = t[: len(t) - len(unit)].strip()
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (e.g. 24G, 512M, 1073741824)") from None
    if not (value >= 0 and value != float("inf")):
        raise ValueError(f"{text!r} is not a size (e.g. 24G, 512M, 1073741824)")
    return int(value * _SIZE_UNITS[unit])


# KREX_SIM_MEM_BYTES as the simulated driver reads it (shim/sim/sim_util.c, sim_parse_bytes):
# whole bytes, optionally with K (or k), M, G or T and then B or iB, between 1 MiB and 1 PiB.
_SIM_BYTES = re.compile(r"([0-9]+)(?:([kKMGT])(?:B|iB)?)?")
SIM_MEM_MIN = 1 << 20


def sim_mem_bytes(text: str) -> int:
    """The simulated GPU's memory that KREX_SIM_MEM_BYTES=text gives, read as the simulated
    driver reads it (the daemon must agree with it); ConfigError naming the variable, the
    value and the range when the driver would ignore it."""
    m = _SIM_BYTES.fullmatch(text)
    bytes_ = 0
    if m and len(m[1]) <= 20:
        bytes_ = int(m[1]) << (10 * (1 + "KMGT".index(m[2].upper())) if m[2] else 0)
    if not SIM_MEM_MIN <= bytes_ <= MAX_BYTES:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ConfigError(
            f"KREX_SIM_MEM_BYTES={shown!r}: the simulated GPU's memory must be whole bytes, "
            "optionally with K, M, G or T, between 1 MiB and 1 PiB (e.g. 80G)"
        )
    return bytes_


def kept_free(total: int, each: int, commands: int) -> int:
    """The device memory admission keeps free on a GPU with `commands` on it: a configured
    total, or `each` per command (Config.headroom_bytes, headroom_each_bytes)."""
    return total + commands * each


def runtime_dir() -> Path:
    """Where the per-user daemon keeps its socket, lock and log (checked: krex/core/trust.py)."""
    from krex.core.trust import TrustError
    from krex.core.trust import runtime_dir as checked

    try:
        return checked()
    except TrustError as e:
        raise ConfigError(str(e)) from e


def default_socket(sim: bool) -> Path:
    """The embedded default daemon's socket (simulated GPUs get a daemon of their own)."""
    return runtime_dir() / ("krex-sim.sock" if sim else "krex.sock")


def parse_cpus(text: str, where: str) -> frozenset[int]:
    """'0-3,8,10-11' -> {0,1,2,3,8,10,11}."""
    try:
        return frozenset(parse_cpu_list(text))
    except SliceError as e:
        raise ConfigError(f"{where}: {e}") from e


@dataclass(frozen=True)
class SliceConfig:
    region: frozenset[int]
    shared: frozenset[int]


def check_socket_path(path: Path, where: str) -> None:
    """ConfigError unless `path` can be a unix socket's path (length, no NUL byte)."""
    raw = os.fsencode(path)
    if b"\0" in raw or not raw or raw in (b".", b".."):
        raise ConfigError(f"{where}: not a usable path ({str(path)!r})")
    if len(raw) > SOCKET_PATH_MAX:
        raise ConfigError(
            f"{where}: {str(path)[:40]}... is too long for a unix socket "
            f"({len(raw)} bytes, at most {SOCKET_PATH_MAX})"
        )


NUMBER = (int, float)  # what a TOML number may be
Check = Callable[[Any, str], None]  # (a set value, "<source>: <key>"): a ConfigError or nothing


@dataclass(frozen=True)
class Key:
    """One setting of the file, a Config field's metadata: its section and key, the TOML type it
    takes, `check` (raises one ConfigError naming the key when the value is out of bounds),
    `convert` (the TOML value to the field's), and for the operator guide its type and bounds
    (`takes`), its default in words where the field's own needs some, and its meaning."""

    section: str
    key: str
    toml: type | tuple[type, ...]
    takes: str
    what: str
    default: str | None = None
    check: Check | None = None
    convert: Callable[[Any], Any] | None = None

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}" if self.key else self.section


def _within(value: float, lo: float, hi: float) -> bool:
    """lo <= value <= hi, compared exactly (an integer too large for a float is out, not an
    OverflowError; nan is out)."""
    return lo <= value <= hi


def _shown(value: object) -> str:
    """A value for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _ints(lo: int, hi: int, says: str = "") -> Check:
    def check(value: int, where: str) -> None:
        if not lo <= value <= hi:
            raise ConfigError(f"{where} must be {says or f'{lo}..{hi}'}, got {_shown(value)}")

    return check


def _positive_seconds(value: float, where: str) -> None:
    if not (_within(value, 0, MAX_SECONDS) and value > 0):
        raise ConfigError(
            f"{where} must be > 0 and finite, at most {MAX_SECONDS:g} (seconds), "
            f"got {_shown(value)}"
        )


def _seconds_or_zero(value: float, where: str) -> None:
    if not _within(value, 0, MAX_SECONDS):
        raise ConfigError(
            f"{where} must be 0..{MAX_SECONDS:g} (seconds), finite, got {_shown(value)}"
        )


def _settle_seconds(value: float, where: str) -> None:
    if not _within(value, 0, MAX_SETTLE_S):
        raise ConfigError(f"{where} must be 0..{MAX_SETTLE_S:g} (seconds), got {_shown(value)}")


def _pace_ms(value: float, where: str) -> None:
    if not _within(value, 0, MAX_PACE_MS):
        raise ConfigError(
            f"{where} must be 0..{MAX_PACE_MS:g} (milliseconds, 0: off), got {_shown(value)}"
        )


def _gibibytes(value: float, where: str) -> None:
    if not _within(value, 0, MAX_GIB):
        raise ConfigError(
            f"{where} must be >= 0 and finite, at most {MAX_GIB} (GiB, 1 PiB), got {_shown(value)}"
        )


def _one_of(choices: tuple[str, ...]) -> Check:
    said = " or ".join(choices) if len(choices) == 2 else f"one of {', '.join(choices)}"

    def check(value: str, where: str) -> None:
        if value not in choices:
            raise ConfigError(f"{where} must be {said}, got {value!r}")

    return check


def _segment_name(seg: str, where: str) -> None:
    if not _SEGMENT_NAME.fullmatch(seg):
        shown = repr(seg[:40]) + ("..." if len(seg) > 40 else "")
        raise ConfigError(
            f"{where} must look like '/name' (1 to {SEGMENT_NAME_MAX} letters, digits, '.', '_' "
            "or '-' after the slash, the first not '.' or '-': it names the daemon's cgroups "
            f"too), got {shown} ({len(seg)} characters)"
        )


def _host(addr: str, where: str) -> None:
    if not (addr and len(addr) <= 253 and addr.isascii() and addr.isprintable()) or " " in addr:
        raise ConfigError(f"{where} must be a host name or address, got {addr[:60]!r}")


def _module_names(names: tuple[str, ...], where: str) -> None:
    for name in names:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise ConfigError(f"{where}: {name!r} is not a module name")


def _gpu_indices(slices: dict[int, SliceConfig], where: str) -> None:
    for gpu in slices:
        if not 0 <= gpu < MAX_GPUS:
            raise ConfigError(f"{where}.{gpu}: a GPU index is 0..{MAX_GPUS - 1}")


def _setting(initial: Any, name: str, toml: type | tuple[type, ...], takes: str, what: str,
             **more: Any) -> Any:  # fmt: skip
    """A Config field that is the setting `name` ('section.key') of the file, `initial` its
    default value (a callable: what makes it)."""
    section, _, key = name.partition(".")
    meta = {"key": Key(section, key, toml, takes, what, **more)}
    if callable(initial):
        return field(default_factory=initial, metadata=meta)
    return field(default=initial, metadata=meta)


def _int(initial: int | None, name: str, lo: int, hi: int, what: str, **more: Any) -> Any:
    return _setting(initial, name, int, f"int {lo}..{hi}", what, check=_ints(lo, hi), **more)


def _seconds(initial: float, name: str, what: str, zero: bool = False) -> Any:
    bounds = ">= 0" if zero else "> 0"
    takes = f"number {bounds}, at most {MAX_SECONDS:.0e}".replace("e+0", "e")
    check = _seconds_or_zero if zero else _positive_seconds
    return _setting(initial, name, NUMBER, takes, what, check=check)


def _settle(initial: float, name: str, what: str, **more: Any) -> Any:
    takes = f"number 0..{MAX_SETTLE_S:g}"
    return _setting(initial, name, NUMBER, takes, what, check=_settle_seconds, **more)


def _gib(name: str, what: str, default: str, more_bounds: str = " (1 PiB)") -> Any:
    takes = f"number 0..{MAX_GIB}{more_bounds}"
    return _setting(None, name, NUMBER, takes, what, check=_gibibytes, default=default)


def _choice(initial: str, name: str, choices: tuple[str, ...], what: str) -> Any:
    words = [f"`{c}`" for c in choices]
    takes = f"string: {', '.join(words[:-1])} or {words[-1]}"
    return _setting(initial, name, str, takes, what, check=_one_of(choices))


def _flag(name: str, what: str) -> Any:
    return _setting(False, name, bool, "bool", what)


@dataclass(frozen=True)
class Config:
    """The settings, in the file's order (`krex config show` prints them so), and `source`."""

    # Each default is a field() with the setting's Key, made once (not a shared mutable value).
    socket: Path | None = _setting(  # noqa: RUF009
        None, "daemon.socket", str, f"string, at most {SOCKET_PATH_MAX} bytes",
        "where the daemon listens", default="per user (below)", check=check_socket_path,
        convert=Path,
    )  # fmt: skip
    segment: str | None = _setting(
        None, "daemon.segment", str, "string `/name`",
        f"the gates' shared-memory segment: 1 to {SEGMENT_NAME_MAX} letters, digits, `.`, `_` "
        "or `-` after the `/`, the first not `.` or `-` (the name is the daemon's cgroup root "
        "too)",
        default="`/krex-<uid>-<hash of socket>`", check=_segment_name,
    )  # fmt: skip
    log_format: str = _choice(
        "text", "daemon.log_format", ("text", "json"),
        "the log's lines: text, or one JSON object each (see Logs)",
    )  # fmt: skip
    gpu_count: int | None = _int(
        None, "gpus.count", 1, MAX_GPUS, "GPUs served",
        default="the GPUs `nvidia-smi -L` lists (1 simulated)",
    )  # fmt: skip
    sim: bool = _flag("gpus.sim", "serve simulated GPUs")
    slots: int = _int(8, "gpus.slots", 1, 256, "commands admitted per GPU at once")
    vendor: str = _choice(
        "auto", "gpus.vendor", VENDORS,
        "the GPUs' kind; `auto`: NVIDIA where `nvidia-smi` is, AMD where only ROCm is (see AMD "
        "GPUs)",
    )  # fmt: skip
    # Limits (time-outs), not measurements: a region's record has drain_s and freeze_s too.
    quiesce_timeout_s: float = _seconds(
        5.0, "timeouts.quiesce_s",
        "waiting for the siblings' threads half-way into the driver (see Time-outs)",
    )  # fmt: skip
    drain_timeout_s: float = _seconds(
        10.0, "timeouts.drain_s", "waiting for the siblings' queued GPU work (see Time-outs)"
    )
    freeze_timeout_s: float = _seconds(
        5.0, "timeouts.freeze_s", "waiting for the siblings' groups to freeze (see Time-outs)"
    )
    region_timeout_s: float = _seconds(
        600.0, "timeouts.region_s",
        "a region's longest life (`krex run --region-timeout` overrides per command; see "
        "Time-outs)",
    )  # fmt: skip
    region_settle_s: float = _settle(
        0.0, "regions.settle_s",
        "a region idles this long after the freeze, before the grant, where the siblings "
        "worked on the GPU in the last second or two (NVML's process samples, or the shim's "
        "count of their driver calls): a power-limited kernel then starts as it would alone "
        "(`krex run --settle` overrides per command; docs/user-guide.md, \"Power-limited "
        "kernels\")",
        default="0.0 (off)",
    )  # fmt: skip
    region_capped_settle_s: float = _settle(
        2.0, "regions.capped_settle_s",
        "the same idle, only for a command one of whose earlier regions ran into the GPU's "
        "power or thermal limit (its record's `gpu_capped` warning): its power-limited kernels "
        "read the siblings' heat, others do not; not for a region an autotuner's candidate "
        "benchmark begins (its record's `candidate`) (`krex run --capped-settle` overrides per "
        "command; 0: off)",
    )  # fmt: skip
    region_freeze: str = _choice(
        "all", "regions.freeze", ("all", "contexts"),
        "which of the siblings' processes a region freezes: `all`, or `contexts`: those that "
        "hold a slot (a GPU context), found none free, or are the GPU's users, while the rest "
        "(compile workers) run on the shared cores; a candidate, not yet measured on a GPU "
        "(see Freezing only GPU contexts)",
    )  # fmt: skip
    region_pace_ms: float = _setting(
        0.0, "regions.pace_ms", NUMBER, f"number 0..{MAX_PACE_MS:g}",
        "outside its own regions a command's thread waits before a launch while the launch "
        "would leave its stream with more than this many milliseconds of GPU work queued (one "
        "launch always goes): what a region's drain waits for beside launching siblings, at "
        "a cost to theirs (an H100: 2-5 % of their work); estimated from the stream's "
        "completed launches (see Pacing)",
        check=_pace_ms, default="0.0 (off)",
    )  # fmt: skip
    freezer: str = _choice(
        "auto", "freezer.backend", FREEZERS,
        "how a command's processes are grouped and frozen (see Freezers)",
    )  # fmt: skip
    slices: dict[int, SliceConfig] = _setting(  # noqa: RUF009
        dict, "slices", dict, f"CPU list strings (CPUs 0..{MAX_CPU}; N 0..{MAX_GPUS - 1})",
        "per GPU N: the cores for the region's owner and those for everyone else (see Core "
        "slices)",
        default="from the topology", check=_gpu_indices,
    )  # fmt: skip
    pool_workers: int | None = _int(
        None, "pool.workers", 0, 256,
        "warm workers (fork servers) per GPU; each forks any number of commands (see Warm "
        "worker pool)",
        default="2 on real GPUs, 0 on simulated ones",
    )  # fmt: skip
    pool_preload: tuple[str, ...] | None = _setting(
        None, "pool.preload", list, "list of modules",
        "imported by each worker if installed; one whose import initialises the GPU driver is "
        "dropped (on torch 2.11, `torch._inductor.compile_fx` does)",
        default="torch, triton, triton.testing (real GPUs)", check=_module_names, convert=tuple,
    )  # fmt: skip
    pool_max_uses: int = _setting(
        100, "pool.max_uses", int, f"int 1..{MAX_POOL_USES}",
        "accepted for older configurations, unused (each command is a fresh process)",
        check=_ints(1, MAX_POOL_USES, f"at least 1, at most {MAX_POOL_USES}"),
    )  # fmt: skip
    mps: bool = _flag("mps.enabled", "start krex's own MPS control daemon (see MPS)")
    memory_headroom_gib: float | None = _gib(
        "memory.headroom_gib",
        "device memory kept free for contexts and libraries' workspaces when admitting, in all "
        "(see Device memory)",
        "0.5 per command on the GPU on real GPUs, 0 simulated",
    )  # fmt: skip
    memory_wait_s: float = _seconds(
        600.0, "memory.wait_s",
        "the longest a call waits for memory before it fails as it would have (the shim's "
        "`KREX_MEM_WAIT_S`; see Device memory)",
    )  # fmt: skip
    memory_deadlock_s: float = _seconds(
        30.0, "memory.deadlock_s",
        "no memory freed this long with waiters though some holder runs: the youngest waiting "
        "command is preempted (see Device memory)",
    )  # fmt: skip
    memory_room_gib: float | None = _gib(
        "memory.room_gib",
        "free device memory a region's owner waits for before its siblings are frozen (0: off; "
        "see Device memory)",
        "1, at most 1/16 of the GPU", ", at most the GPU's memory (checked at the start)",
    )  # fmt: skip
    memory_room_wait_s: float = _seconds(
        10.0, "memory.room_wait_s",
        "the longest that wait lasts (then the region goes ahead); after half of it with no "
        "memory back, a waiting command that holds memory is preempted for the room",
    )  # fmt: skip
    memory_retake_after_s: float = _seconds(
        5.0, "memory.retake_after_s",
        "a timer's region revoked for memory is timed again (retaken) where its command has run "
        "this long; a younger command is preempted and run again, cheaper than holding its "
        "memory through the wait (0: always retake; see Device memory)", zero=True,
    )  # fmt: skip
    memory_swap: str = _choice(
        "auto", "memory.swap", ("auto", "off"),
        "break a memory deadlock by taking a waiting command off the GPU with the driver's "
        "checkpoint API and putting it back later, where the driver can (auto), instead of "
        "preempting it (see Device memory)",
    )  # fmt: skip
    memory_unknown_gib: float | None = _gib(
        "memory.unknown_gib",
        "what a command never seen is expected to need until a few peaks are learned (0: "
        "admitted whatever; see Device memory)",
        "1/8 of the GPU less the headroom", "",
    )  # fmt: skip
    metrics_port: int = _int(
        0, "metrics.port", 0, 65535, "the Prometheus endpoint's port (see Metrics and live view)",
        default="0 (off)",
    )  # fmt: skip
    metrics_address: str = _setting(
        "127.0.0.1", "metrics.address", str, "string: a host name or address",
        "where the Prometheus endpoint listens", check=_host,
    )  # fmt: skip
    source: str = "defaults"

    def socket_path(self) -> Path:
        return self.socket or default_socket(self.sim)

    def segment_name(self) -> str:
        if self.segment:
            return self.segment
        # One segment per daemon socket, so a sim daemon and a real one can live side by side.
        # A stable hash: a restarted daemon must find its predecessor's segment.
        return f"/krex-{os.getuid()}-{zlib.crc32(str(self.socket_path()).encode()):08x}"

    def workers_per_gpu(self) -> int:
        """Warm workers (fork servers) per GPU: configured, else 2 (one forks any number of
        commands; the second serves while the first is replaced); none on simulated GPUs:
        they have no framework to pre-import."""
        if self.pool_workers is not None:
            return self.pool_workers
        return 0 if self.sim else 2

    def headroom_bytes(self) -> int:
        """Device memory admission keeps free per GPU in all, configured (else 0: see
        `headroom_each_bytes`)."""
        if self.memory_headroom_gib is not None:
            return int(self.memory_headroom_gib * (1 << 30))
        return 0

    def headroom_each_bytes(self) -> int:
        """Device memory admission keeps free per command on a GPU (those admitted and the one
        being admitted), unless a total is configured: half a GiB on real GPUs (a context and
        a library's workspace), none on simulated ones. Per command, not per slot: 16 slots
        kept 8 GiB free where 4 commands ran, and admitted fewer than 8 slots did (an H100,
        2026-12-06: 3.5 commands running on average against 3.8)."""
        if self.memory_headroom_gib is not None or self.sim:
            return 0
        return 1 << 29

    def room_bytes(self, capacity: int) -> int:
        """Free memory a region's owner waits for before its siblings are frozen: configured,
        else 1 GiB, at most a sixteenth of the GPU's `capacity` (0: unknown)."""
        if self.memory_room_gib is not None:
            return int(self.memory_room_gib * (1 << 30))
        return min(1 << 30, capacity // 16)

    def unknown_bytes(self, capacity: int) -> int:
        """What a command never seen is expected to need until a few peaks are learned:
        configured, else an eighth of what admission may give out of the GPU's `capacity` (0:
        unknown), its headroom kept: eight such commands are admitted at once. (An eighth of
        the whole GPU let seven in: on the H200 an eighth one waited for a slot's worth of
        memory that eight long-running commands of 0.6 GiB each never needed.)"""
        if self.memory_unknown_gib is not None:
            return int(self.memory_unknown_gib * (1 << 30))
        free = kept_free(self.headroom_bytes(), self.headroom_each_bytes(), 8)
        return max(0, capacity - free) // 8

    def preload(self) -> tuple[str, ...]:
        """Modules each worker imports (those not installed are skipped by the daemon)."""
        if self.pool_preload is not None:
            return self.pool_preload
        # triton's timers: every do_bench command would import them. Not Inductor's compiler
        # (torch._inductor.compile_fx): on torch 2.11 its import initialises the GPU driver, so
        # the worker dropped it and started again, every time (docs/pool.md); any module that
        # does is dropped so (krex/pool/worker.py).
        return () if self.sim else ("torch", "triton", "triton.testing")


# (field, Key) of every setting, in the file's order.
SETTINGS: tuple[tuple[str, Key], ...] = tuple(
    (f.name, f.metadata["key"]) for f in fields(Config) if "key" in f.metadata
)
# Each TOML key's type and Config field (the file's names are the operators'; the fields say
# what they are). [slices] is a table of GPUs, checked and read on its own.
_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {}
_FIELDS: dict[tuple[str, str], str] = {}
_KEYS: dict[tuple[str, str], Key] = {}
for _name, _key in SETTINGS:
    if _key.section != "slices":
        _SCHEMA.setdefault(_key.section, {})[_key.key] = _key.toml
        _FIELDS[_key.section, _key.key] = _name
        _KEYS[_key.section, _key.key] = _key
del _name, _key


def keys_table() -> str:
    """The operator guide's table of settings (docs/operator-guide.md, written by
    scripts/config_table.py), one row per setting."""
    defaults = Config()
    rows = ["| key | type | default | what |", "| --- | --- | --- | --- |"]
    for name, key in SETTINGS:
        shown = f"`{key.name}`"
        if key.section == "slices":
            shown = "`slices.N.region`, `slices.N.shared`"
        default = key.default or _in_words(getattr(defaults, name))
        rows.append(f"| {shown} | {key.takes} | {default} | {key.what} |")
    return "\n".join(rows) + "\n"


def _in_words(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`" if isinstance(value, str) else str(value)


def _type_name(want: type | tuple[type, ...]) -> str:
    """What a key takes, in words (a TOML value's kind, not a Python type)."""
    names = {int: "an integer", bool: "true or false", str: "a string", list: "a list"}
    if isinstance(want, tuple):
        return "a number"
    return names.get(want, want.__name__)


def _kind(value: object) -> str:
    """What a TOML value is, in words."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return "a date or time"


def _unknown(name: str, known: list[str], prefix: str = "") -> str:
    """A hint for an unknown name: the closest known one, else all of them."""
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f" (did you mean {prefix}{close[0]}?)"
    return f" (known: {', '.join(prefix + k for k in sorted(known))})"


def _check(doc: dict[str, Any], where: str) -> None:
    for section, body in doc.items():
        if section == "slices":
            if not isinstance(body, dict):
                raise ConfigError(f"{where}: [slices] must be a table of GPUs")
            for gpu, s in body.items():
                key = f"slices.{gpu}"
                if not (gpu.isascii() and gpu.isdigit() and int(gpu) < MAX_GPUS):
                    raise ConfigError(
                        f"{where}: {key}: the key must be a GPU index, 0..{MAX_GPUS - 1}"
                    )
                if not isinstance(s, dict) or set(s) - {"region", "shared"}:
                    raise ConfigError(f"{where}: {key} takes only 'region' and 'shared'")
                for k in ("region", "shared"):
                    if not isinstance(s.get(k), str):
                        raise ConfigError(f"{where}: {key}.{k} must be a CPU list string")
            continue
        if section not in _SCHEMA:
            hint = _unknown(section, [*_SCHEMA, "slices"])
            raise ConfigError(f"{where}: unknown section [{section}]{hint}")
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: [{section}] must be a table")
        for key, value in body.items():
            want = _SCHEMA[section].get(key)
            if want is None:
                hint = _unknown(key, list(_SCHEMA[section]), f"{section}.")
                raise ConfigError(f"{where}: unknown key {section}.{key}{hint}")
            bad_bool = isinstance(value, bool) and want is not bool
            if bad_bool or not isinstance(value, want):
                shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
                raise ConfigError(
                    f"{where}: {section}.{key} has the wrong type: {_type_name(want)} is "
                    f"expected, got {shown} ({_kind(value)})"
                )


def from_toml(text: str, where: str = "config") -> Config:
    """Parse and validate a configuration document."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from e
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(f"{where}: not valid TOML: nested too deeply") from None
    _check(doc, where)
    values: dict[str, Any] = {"source": where}
    for section, body in doc.items():
        if section == "slices":
            values["slices"] = {
                int(k): SliceConfig(
                    parse_cpus(v["region"], f"{where}: slices.{k}.region"),
                    parse_cpus(v["shared"], f"{where}: slices.{k}.shared"),
                )
                for k, v in body.items()
            }
            continue
        for key, value in body.items():
            values[_FIELDS[section, key]] = _field_value(_KEYS[section, key], value)
    cfg = Config(**values)  # every default is the dataclass's own
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Value checks that do not depend on the machine: every number within what krex can hold
    (one ConfigError naming the key, its value and the range), each setting's Key's check."""
    for name, key in SETTINGS:
        value = getattr(cfg, name)
        if key.check is not None and value is not None:
            key.check(value, f"{cfg.source}: {key.name}")


def _field_value(key: Key, value: Any) -> Any:
    """A TOML value of the right type as its Config field holds it."""
    if key.convert is not None:
        return key.convert(value)
    if key.toml == NUMBER and isinstance(value, int) and abs(value) <= MAX_EXACT_INT:
        return float(value)  # a longer one overflows float(): validate() refuses it as it is
    return value


def load(path: Path | None = None) -> Config:
    """The effective configuration: the file given, $KREX_CONFIG, /etc/krex/config.toml, or
    the embedded defaults."""
    if path is None and os.environ.get("KREX_CONFIG"):
        path = Path(os.environ["KREX_CONFIG"])
    if path is None and DEFAULT_PATH.is_file():
        path = DEFAULT_PATH
    if path is None:
        return Config()
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the configuration ({e.strerror})") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not valid TOML: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    return from_toml(text, str(path))

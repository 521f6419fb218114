"""The controller's configuration: TOML, validated, with defaults derived from the machine.

Looked up in this order: the `--config` flag, `$KREX_CONFIG`, `/etc/krex/config.toml`; without
any, the embedded defaults. Every bad key or value is one `ConfigError` naming it.

```toml
[daemon]
socket = "/run/krex/krex.sock"   # default: $XDG_RUNTIME_DIR/krex/krex.sock or /tmp/krex-$UID/
segment = "/krex-0"              # shared-memory name (default derived from the socket)
log_format = "text"              # text | json (one JSON object per line)

[gpus]
count = 1          # default: the GPUs the driver shows (or 1 simulated GPU)
sim = false        # serve simulated GPUs (krex run --sim)
vendor = "auto"    # auto | nvidia | amd (AMD: HIP through LD_AUDIT, docs/hip.md; untested on
                   # real AMD GPUs); auto: nvidia where nvidia-smi is, amd where only ROCm is
slots = 8          # commands admitted per GPU at once

[timeouts]
quiesce_s = 5.0    # waiting for siblings half-way into the driver
drain_s = 10.0     # waiting for siblings' queued GPU work
freeze_s = 5.0     # waiting for siblings' cgroups to freeze
region_s = 600.0   # a region's longest life (krex run --region-timeout overrides per command)

[regions]
settle_s = 0.0     # after the freeze, idle this long before the grant when the GPU's
                   # siblings worked on it in the last second or two (NVML's process
                   # samples, or the shim's count of their driver calls): a
                   # power-limited kernel then starts as it would alone (0: off; at most 5;
                   # krex run --settle overrides per command; docs/user-guide.md)
capped_settle_s = 2.0  # the same idle, only for a command that already ran into the GPU's
                   # power (or thermal) limit in one of its regions (its record's
                   # gpu_capped warning): its kernels are the power-limited ones (0: off;
                   # at most 5; krex run --capped-settle overrides per command)

[freezer]
backend = "auto"   # auto | cgroup-v2 | cgroup-v1 | signal

[slices.0]         # per GPU: cores for the region owner, cores for everyone else
region = "0-1"
shared = "2-15"

[mps]
enabled = false

[pool]             # warm workers: fork servers (docs/pool.md)
workers = 2        # per GPU; each forks any number of commands (default: 2 on real GPUs,
                   # 0 on simulated ones)
preload = ["torch", "triton"]   # imported by each worker where installed (default: these
                                # and Inductor on real GPUs, none on simulated ones)
max_uses = 100     # accepted for older configurations; unused (each command is a fresh child)

[memory]           # device memory (docs/memory.md)
headroom_gib = 4.0 # kept free for contexts and libraries' workspaces when admitting (default:
                   # 0.5 per slot on real GPUs, 0 on simulated ones)
wait_s = 600.0     # longest a call waits for memory before it fails as it would have (the
                   # command's regions then say so, and it runs again alone)
deadlock_s = 30.0  # no memory freed this long with waiters though some holder runs: the
                   # youngest waiting command is preempted (run again from the start); at
                   # once (1 s) when every process holding memory waits
room_gib = 1.0     # free device memory a region's owner waits for before its siblings are
                   # frozen (default: 1, at most 1/16 of the GPU; 0: off)
room_wait_s = 10.0 # the longest that wait lasts (then the region goes ahead)
unknown_gib = 17.0 # what a command never seen is expected to need until a few peaks are
                   # learned (default: an eighth of the GPU less the headroom; 0: admitted
                   # whatever)

[metrics]
port = 0           # Prometheus endpoint (0: off; needs prometheus-client)
address = "127.0.0.1"
```
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from krex.core.errors import KrexError
from krex.core.slices import SliceError, parse_cpu_list

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


@dataclass(frozen=True)
class Config:
    socket: Path | None = None
    segment: str | None = None
    gpu_count: int | None = None
    sim: bool = False
    vendor: str = "auto"
    slots: int = 8
    # Limits (time-outs), not measurements: a region's record has drain_s and freeze_s too.
    quiesce_timeout_s: float = 5.0
    drain_timeout_s: float = 10.0
    freeze_timeout_s: float = 5.0
    region_timeout_s: float = 600.0
    region_settle_s: float = 0.0
    region_capped_settle_s: float = 2.0
    freezer: str = "auto"
    slices: dict[int, SliceConfig] = field(default_factory=dict)
    mps: bool = False
    pool_workers: int | None = None
    pool_preload: tuple[str, ...] | None = None
    pool_max_uses: int = 100
    memory_headroom_gib: float | None = None
    memory_wait_s: float = 600.0
    memory_deadlock_s: float = 30.0
    memory_room_gib: float | None = None
    memory_room_wait_s: float = 10.0
    memory_unknown_gib: float | None = None
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    log_format: str = "text"
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
        """Device memory admission keeps free per GPU: configured, else half a GiB per slot
        on real GPUs (a context and a library's workspace each), none on simulated ones."""
        if self.memory_headroom_gib is not None:
            return int(self.memory_headroom_gib * (1 << 30))
        return 0 if self.sim else self.slots * (1 << 29)

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
        return max(0, capacity - self.headroom_bytes()) // 8

    def preload(self) -> tuple[str, ...]:
        """Modules each worker imports (those not installed are skipped by the daemon)."""
        if self.pool_preload is not None:
            return self.pool_preload
        # triton's timers: every do_bench command would import them. Not Inductor's compiler
        # (torch._inductor.compile_fx): on torch 2.11 its import initialises the GPU driver, so
        # the worker dropped it and started again, every time (docs/pool.md); any module that
        # does is dropped so (krex/pool/worker.py).
        return () if self.sim else ("torch", "triton", "triton.testing")


_SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "daemon": {"socket": str, "segment": str, "log_format": str},
    "gpus": {"count": int, "sim": bool, "slots": int, "vendor": str},
    "timeouts": {
        "quiesce_s": (int, float),
        "drain_s": (int, float),
        "freeze_s": (int, float),
        "region_s": (int, float),
    },
    "regions": {"settle_s": (int, float), "capped_settle_s": (int, float)},
    "freezer": {"backend": str},
    "mps": {"enabled": bool},
    "pool": {"workers": int, "preload": list, "max_uses": int},
    "metrics": {"port": int, "address": str},
    "memory": {
        "headroom_gib": (int, float),
        "wait_s": (int, float),
        "deadlock_s": (int, float),
        "room_gib": (int, float),
        "room_wait_s": (int, float),
        "unknown_gib": (int, float),
    },
}
# Each TOML key's Config field (the file's names are the operators'; the fields say what they are).
_FIELDS: dict[tuple[str, str], str] = {
    ("daemon", "socket"): "socket",
    ("daemon", "segment"): "segment",
    ("daemon", "log_format"): "log_format",
    ("gpus", "count"): "gpu_count",
    ("gpus", "sim"): "sim",
    ("gpus", "vendor"): "vendor",
    ("gpus", "slots"): "slots",
    ("timeouts", "quiesce_s"): "quiesce_timeout_s",
    ("timeouts", "drain_s"): "drain_timeout_s",
    ("timeouts", "freeze_s"): "freeze_timeout_s",
    ("timeouts", "region_s"): "region_timeout_s",
    ("regions", "settle_s"): "region_settle_s",
    ("regions", "capped_settle_s"): "region_capped_settle_s",
    ("freezer", "backend"): "freezer",
    ("mps", "enabled"): "mps",
    ("pool", "workers"): "pool_workers",
    ("pool", "preload"): "pool_preload",
    ("pool", "max_uses"): "pool_max_uses",
    ("memory", "headroom_gib"): "memory_headroom_gib",
    ("memory", "wait_s"): "memory_wait_s",
    ("memory", "deadlock_s"): "memory_deadlock_s",
    ("memory", "room_gib"): "memory_room_gib",
    ("memory", "room_wait_s"): "memory_room_wait_s",
    ("memory", "unknown_gib"): "memory_unknown_gib",
    ("metrics", "port"): "metrics_port",
    ("metrics", "address"): "metrics_address",
}


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
            name = _FIELDS[section, key]
            if name == "socket":
                value = Path(value)
            elif name == "pool_preload":
                value = tuple(value)
            elif (
                isinstance(value, int)
                and _SCHEMA[section][key] == (int, float)
                and abs(value) <= MAX_EXACT_INT  # a longer one overflows float(): validate()
            ):  # refuses it as it is
                value = float(value)
            values[name] = value
    cfg = Config(**values)  # every default is the dataclass's own
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Value checks that do not depend on the machine: every number within what krex can hold
    (one ConfigError naming the key, its value and the range)."""
    if cfg.gpu_count is not None and not 1 <= cfg.gpu_count <= MAX_GPUS:
        raise ConfigError(
            f"{cfg.source}: gpus.count must be 1..{MAX_GPUS}, got {_shown(cfg.gpu_count)}"
        )
    if cfg.vendor not in VENDORS:
        raise ConfigError(
            f"{cfg.source}: gpus.vendor must be one of {', '.join(VENDORS)}, got {cfg.vendor!r}"
        )
    if not 1 <= cfg.slots <= 256:
        raise ConfigError(f"{cfg.source}: gpus.slots must be 1..256, got {_shown(cfg.slots)}")
    for section, key in (
        *(("timeouts", k) for k in ("quiesce_s", "drain_s", "freeze_s", "region_s")),
        *(("memory", k) for k in ("wait_s", "deadlock_s", "room_wait_s")),
    ):
        value = getattr(cfg, _FIELDS[section, key])
        if not (_within(value, 0, MAX_SECONDS) and value > 0):
            raise ConfigError(
                f"{cfg.source}: {section}.{key} must be > 0 and finite, at most "
                f"{MAX_SECONDS:g} (seconds), got {_shown(value)}"
            )
    for key in ("settle_s", "capped_settle_s"):
        value = getattr(cfg, _FIELDS["regions", key])
        if not _within(value, 0, MAX_SETTLE_S):
            raise ConfigError(
                f"{cfg.source}: regions.{key} must be 0..{MAX_SETTLE_S:g} (seconds), "
                f"got {_shown(value)}"
            )
    for key in ("headroom_gib", "room_gib", "unknown_gib"):
        gib = getattr(cfg, _FIELDS["memory", key])
        if gib is not None and not _within(gib, 0, MAX_GIB):
            raise ConfigError(
                f"{cfg.source}: memory.{key} must be >= 0 and finite, at most {MAX_GIB} "
                f"(GiB, 1 PiB), got {_shown(gib)}"
            )
    if cfg.pool_workers is not None and not 0 <= cfg.pool_workers <= 256:
        raise ConfigError(
            f"{cfg.source}: pool.workers must be 0..256, got {_shown(cfg.pool_workers)}"
        )
    if not 1 <= cfg.pool_max_uses <= MAX_POOL_USES:
        raise ConfigError(
            f"{cfg.source}: pool.max_uses must be at least 1, at most {MAX_POOL_USES}, "
            f"got {_shown(cfg.pool_max_uses)}"
        )
    for gpu in cfg.slices:
        if not 0 <= gpu < MAX_GPUS:
            raise ConfigError(f"{cfg.source}: slices.{gpu}: a GPU index is 0..{MAX_GPUS - 1}")
    for name in cfg.pool_preload or ():
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise ConfigError(f"{cfg.source}: pool.preload: {name!r} is not a module name")
    if not 0 <= cfg.metrics_port <= 65535:
        raise ConfigError(
            f"{cfg.source}: metrics.port must be 0..65535, got {_shown(cfg.metrics_port)}"
        )
    addr = cfg.metrics_address
    if not (addr and len(addr) <= 253 and addr.isascii() and addr.isprintable()) or " " in addr:
        raise ConfigError(
            f"{cfg.source}: metrics.address must be a host name or address, got {addr[:60]!r}"
        )
    if cfg.log_format not in ("text", "json"):
        raise ConfigError(
            f"{cfg.source}: daemon.log_format must be text or json, got {cfg.log_format!r}"
        )
    if cfg.freezer not in FREEZERS:
        raise ConfigError(
            f"{cfg.source}: freezer.backend must be one of {', '.join(FREEZERS)}, "
            f"got {cfg.freezer!r}"
        )
    seg = cfg.segment
    if seg is not None and not _SEGMENT_NAME.fullmatch(seg):
        shown = repr(seg[:40]) + ("..." if len(seg) > 40 else "")
        raise ConfigError(
            f"{cfg.source}: daemon.segment must look like '/name' (1 to {SEGMENT_NAME_MAX} "
            "letters, digits, '.', '_' or '-' after the slash, the first not '.' or '-': it "
            f"names the daemon's cgroups too), got {shown} ({len(seg)} characters)"
        )
    if cfg.socket is not None:
        check_socket_path(cfg.socket, f"{cfg.source}: daemon.socket")


def _within(value: float, lo: float, hi: float) -> bool:
    """lo <= value <= hi, compared exactly (an integer too large for a float is out, not an
    OverflowError; nan is out)."""
    return lo <= value <= hi


def _shown(value: object) -> str:
    """A value for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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

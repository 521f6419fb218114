"""What operators read: `krex status` as tables, `krex top` live, `krex config show`.

Everything here renders a status or configuration document (dicts, as `krex status --json`
prints them) with rich; nothing talks to the daemon.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from rich.console import Group
from rich.table import Table

from krex.core.config import SETTINGS, Config


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _memory_cell(mem: dict[str, Any]) -> str:
    """'12/140 (2, oldest 3.1 s)': GiB held by tenants' processes of the GPU's capacity, how
    many wait and the oldest wait."""
    if not mem:
        return "-"
    gib = 1 << 30
    cap = mem.get("capacity_bytes", 0)
    text = f"{mem.get('held_bytes', 0) / gib:.0f}/{cap / gib:.0f}" if cap else "?"
    waiting = mem.get("waiting", 0)
    if waiting:
        return f"{text} ({waiting}, oldest {mem.get('oldest_wait_s', 0.0):.1f} s)"
    return f"{text} (0)"


def _tenant_memory_cells(mem: dict[str, Any]) -> tuple[str, str]:
    """('3.2 (8.0)', '1.5'): GiB its processes hold now (the shim's count; NVML's after a
    slash where NVML gives it) and their peak; how long it has been waiting for memory."""
    if not mem:
        return "-", "-"
    gib = 1 << 30
    held = f"{mem.get('bytes', 0) / gib:.1f}"
    if mem.get("nvml_bytes") is not None:
        held += f"/{mem['nvml_bytes'] / gib:.1f}"
    waiting = mem.get("waiting_s", 0.0)
    return f"{held} ({mem.get('peak_bytes', 0) / gib:.1f})", f"{waiting:.1f}" if waiting else "-"


def status_tables(st: dict[str, Any]) -> Group:
    """The GPUs (slots, queues, region, recent regions, pool) and their tenants, as tables."""
    kind = "simulated" if st["sim"] else "real"
    vendor = "AMD" if st.get("vendor") == "amd" else "NVIDIA"
    gpus = Table(
        title=f"krex {st['version']} (pid {st['pid']}) on {st['socket']}: {kind} {vendor} GPUs, "
        f"freezer {st['freezer']}, MPS {'on' if st['mps'] else 'off'}",
        title_justify="left",
    )
    for col in (
        "GPU",
        "slots",
        "queued",
        "region (tenant, age)",
        "waiting",
        "regions/min",
        "wait p50/p95 ms",
        "drain p50/p95 ms",
        "pool idle/busy/starting",
        "memory GiB (waiting)",
        "foreign",
    ):
        gpus.add_column(col)
    tenants = Table(title="tenants", title_justify="left")
    for col in ("GPU", "tenant", "pids", "regions", "age s", "memory GiB (peak)", "memory wait s"):
        tenants.add_column(col)
    tenants.add_column("command")
    for g in st["gpus"]:
        r, rec, pool = g["region"], g.get("recent") or {}, g.get("pool") or {}
        gpus.add_row(
            str(g["gpu"]),
            f"{g['used']}/{g['slots']}",
            str(g["queue"]),
            "-" if r is None else f"{r['tenant']}, {r['age_s']:.1f} s",
            str(g["region_queue"]),
            f"{rec.get('regions_per_min', 0):.0f}",
            f"{_ms(rec.get('wait_ms_p50'))}/{_ms(rec.get('wait_ms_p95'))}",
            f"{_ms(rec.get('drain_ms_p50'))}/{_ms(rec.get('drain_ms_p95'))}",
            f"{pool.get('idle', 0)}/{pool.get('busy', 0)}/{pool.get('starting', 0)}"
            if pool.get("target")
            else "off",
            _memory_cell(g.get("memory") or {}),
            ", ".join(map(str, g.get("foreign", []))) or "-",
        )
        for t in g["tenants"]:
            tenants.add_row(
                str(g["gpu"]),
                str(t["tenant"]),
                " ".join(map(str, t["pids"])),
                str(t["regions"]),
                f"{t['age_s']:.1f}",
                *_tenant_memory_cells(t.get("memory") or {}),
                " ".join(t["argv"])[:60],
            )
    return Group(gpus, tenants)


def effective_config(cfg: Config) -> dict[str, Any]:
    """The configuration a daemon would run with here, derived defaults filled in: the GPUs,
    each one's core slices, the pool, the freezer that would be used."""
    from krex.core.tenants import TenantsError, detect_freezer
    from krex.daemon.node import node_plan, resolve_vendor

    n, slices = node_plan(cfg)
    try:
        freezer = detect_freezer(cfg.freezer).value
    except TenantsError as e:
        freezer = f"unusable: {e}"
    preload = list(cfg.preload())
    # What the daemon derives where the file leaves it to the machine.
    derived: dict[str, Any] = {
        "daemon.socket": str(cfg.socket_path()),
        "daemon.segment": cfg.segment_name(),
        "gpus.count": n,
        "gpus.vendor": resolve_vendor(cfg),
        "pool.workers": cfg.workers_per_gpu(),
        "pool.preload": preload,
        "memory.headroom_gib": (
            f"{cfg.headroom_each_bytes() / (1 << 30):g} per command on the GPU"
            if cfg.headroom_each_bytes()
            else cfg.headroom_bytes() / (1 << 30)
        ),
        "slices": {
            str(s.gpu): {
                "region": ",".join(map(str, sorted(s.region_cores))),
                "shared": ",".join(map(str, sorted(s.shared_cores))),
            }
            for s in slices
        },
    }
    # What only this machine says, shown after the setting it concerns.
    beside: dict[str, dict[str, Any]] = {
        "freezer.backend": {"in_use": freezer},
        "pool.preload": {
            "preload_installed": [m for m in preload if importlib.util.find_spec(m) is not None]
        },
    }
    doc: dict[str, Any] = {"source": cfg.source}
    for name, key in SETTINGS:
        value = derived[key.name] if key.name in derived else getattr(cfg, name)
        if not key.key:  # a table of its own (slices)
            doc[key.section] = value
            continue
        section = doc.setdefault(key.section, {})
        section[key.key] = value
        section.update(beside.get(key.name, {}))
    doc["cores_available"] = sorted(os.sched_getaffinity(0))
    return doc


def config_toml(doc: dict[str, Any]) -> str:
    """effective_config() as TOML a daemon accepts (derived values as comments where they are
    not settings)."""
    lines = [f"# effective configuration (from {doc['source']})"]
    settable: dict[str, list[str]] = {}
    for _, key in SETTINGS:
        if key.key:  # not [slices], printed last
            settable.setdefault(key.section, []).append(key.key)
    for section, keys in settable.items():
        lines.append(f"\n[{section}]")
        for k in keys:
            value = doc[section][k]
            # None: derived per GPU when the daemon starts (e.g. memory.room_gib).
            lines.append(
                f"# {k}: per GPU, the default" if value is None else f"{k} = {_toml(value)}"
            )
        if section == "freezer":
            lines.append(f"# in use here: {doc['freezer']['in_use']}")
        if section == "pool":
            lines.append(
                f"# installed here: {', '.join(doc['pool']['preload_installed']) or 'none'}"
            )
    for gpu, s in doc["slices"].items():
        lines += [
            f"\n[slices.{gpu}]",
            f"region = {_toml(s['region'])}",
            f"shared = {_toml(s['shared'])}",
        ]
    return "\n".join(lines) + "\n"


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)

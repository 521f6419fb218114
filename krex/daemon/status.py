"""What the daemon's `status` answers (docs/protocol.md): the node, each GPU, each tenant."""

from __future__ import annotations

import os
import time
from typing import Any

from krex.core.shm import SlotView
from krex.core.version import __version__
from krex.daemon.model import Gpu, Tenant
from krex.daemon.node import Node


def status(node: Node) -> dict[str, Any]:
    """The node's status: its segment, settings that tell how it runs, and every GPU."""
    live = node.segments.live_by_tenant()
    return {
        "version": __version__,
        "pid": os.getpid(),
        "socket": str(node.socket),
        "segment": node.segments.gates.name,
        "segment_linked": node.segments.linked(),
        "slot_segments": len(node.segments.tenants) + len(node.segments.orphans),
        "sim": node.cfg.sim,
        "vendor": node.vendor,
        "freezer": node.freezer.value,
        "mps": node.mps is not None,
        "gpus": [_gpu(node, g, time.monotonic(), live) for g in node.gpus],
    }


def _gpu(node: Node, g: Gpu, now: float, live: dict[int, list[SlotView]]) -> dict[str, Any]:
    regions = node.regions
    held, pending = regions.held(g.index), regions.setting_up(g.index)
    return {
        "gpu": g.index,
        "slots": g.slots,
        "used": len(g.tenants),
        "queue": len(g.admission),
        "region_queue": regions.queued(g.index),
        "setting_up": pending.tenant.id if pending is not None else None,
        "foreign": sorted(node.machinery.foreign(g.index)),
        "recent": node.metrics.recent[g.index].summary(),
        "pool": node.pool.status(g),
        "memory": node.memory.status(g.index),
        "region_cores": sorted(g.slice.region_cores),
        "shared_cores": sorted(g.slice.shared_cores),
        "region": None
        if held is None or not held.granted
        else {
            "tenant": held.tenant.id,
            "gpus": list(held.gpus),
            "age_s": now - held.t_grant,
            "clean": held.clean,
        },
        "tenants": [
            {
                "tenant": t.id,
                "gpus": t.gpus,
                "argv": [a[:1024] for a in t.argv[:8]],  # a long argv stays in its report
                "pids": t.pids,
                "age_s": now - t.t_admit,
                "regions": len(t.regions),
                "memory": _tenant_memory(t, live.get(t.id, [])),
            }
            for t in g.tenants
        ],
    }


def _tenant_memory(t: Tenant, live: list[SlotView]) -> dict[str, Any]:
    """What t's live processes (`live`, their slots) hold now (the shim's count and
    NVML's), its peak, and how long it has been waiting for memory (0: not waiting)."""
    since = [s.mem_since_ns for s in live if s.mem_want and s.mem_since_ns]
    return {
        "bytes": sum(s.mem_bytes for s in live),
        "peak_bytes": max([t.mem_peak, *(s.mem_peak for s in live)]),
        "waiting_s": (time.monotonic_ns() - min(since)) / 1e9 if since else 0.0,
        "nvml_bytes": t.nvml_bytes,
    }

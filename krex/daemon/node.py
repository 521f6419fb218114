"""What this node has: its GPUs (how many, whose), each GPU's CPU slice, and `Node`, the
node's state and parts (tenants, segments, machinery, regions, memory, admission, pool) with
the small interface they are handed (MemoryNode, PoolHost). The daemon serves connections
over a Node (krex/daemon/daemon.py)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from krex.core.build import identity
from krex.core.config import Config, ConfigError, sim_mem_bytes
from krex.core.errors import KrexError, ProtocolError
from krex.core.nvml import Nvml
from krex.core.paths import (
    hip_audit_library,
    hip_shim_library,
    shim_library,
    sim_hip_available,
    sim_library_dir,
)
from krex.core.shm import MEM_KINDS, SegmentError, SlotView
from krex.core.slices import Slice, SliceError, default_slices, validate_slices
from krex.core.tenants import FreezerKind, TenantGroup, TenantsError, detect_freezer, prune
from krex.daemon.admission import Admission
from krex.daemon.machinery import NodeMachinery
from krex.daemon.memory import Memory, Pokable, command_asks
from krex.daemon.metrics import Metrics
from krex.daemon.model import AdmitRequest, Gpu, Tenant, gpu_names
from krex.daemon.mps import Mps
from krex.daemon.regions import Regions
from krex.daemon.segments import Segments
from krex.daemon.swap import Swaps, work_s
from krex.daemon.workers import Pool
from krex.sim.simnode import segment_name as sim_segment

log = logging.getLogger("krex.daemon")

SIM_MEM = 143771 << 20  # the simulated GPU's default memory (shim/sim/sim.h: an H200's)
_TENANT_SLOTS = 64  # process slots in a tenant's own segment


class Node:
    """One node's state and parts, and what the parts ask of it: the memory arbiter's
    MemoryNode (who holds a region, who may be preempted, what the driver says) and the pool's
    PoolHost (settings, segments, a tenant's environment). Built before the daemon serves;
    every method runs on the daemon's event loop."""

    def __init__(self, cfg: Config, socket: Path, root: str) -> None:
        self.cfg, self.socket, self.root = cfg, socket, root
        self.build = identity()  # what it started as (a rebuilt checkout is another build)
        n, slices = node_plan(cfg)
        try:
            self.freezer: FreezerKind = detect_freezer(cfg.freezer)
        except TenantsError as e:
            raise ConfigError(f"{cfg.source}: freezer.backend: {e}") from e
        self.vendor = resolve_vendor(cfg)
        if self.vendor == "amd" and cfg.sim and not sim_hip_available():
            raise ConfigError("the simulated HIP runtime (libamdhip64.so) is not built: make build")
        self.gpus = [Gpu(index=i, slots=cfg.slots, slice=slices[i]) for i in range(n)]
        self.tenants: dict[int, Tenant] = {}
        self.segments = Segments(cfg.segment_name(), n, cfg.slots, root)
        try:
            self.nvml = None if cfg.sim or self.vendor == "amd" else Nvml.open()
            self.metrics = Metrics(n)
            self.machinery = NodeMachinery(cfg, self.gpus, self.segments, self.nvml)
            self.swaps = Swaps(
                enabled=cfg.memory_swap == "auto" and not cfg.mps,
                sim_shm=sim_segment(self.segments.gates.name) if cfg.sim else "",
                on_refused=self._swap_refused,
                on_failed=self._swap_refused,
            )
            self.memory = self._memory()
            self.regions = Regions(
                self.gpus,
                self.machinery,
                room=self.memory,
                swaps=self.swaps,
                on_record=lambda t, rec: self.metrics.region(t.gpu, rec),
            )
            self.admission = Admission(self.gpus, self.memory)
            # Top-level names only: finding a submodule's spec would import its package here.
            self.preload = [
                m for m in cfg.preload() if importlib.util.find_spec(m.split(".")[0]) is not None
            ]
            self.pool = Pool(self)
        except BaseException:
            # A start refused (a bad setting, no NVML): nothing of ours stays; what a dead
            # predecessor left stays for the next.
            self.segments.abandon()
            raise
        self.mps: Mps | None = None  # started as the daemon begins to serve
        self.stop = asyncio.Event()  # set: the daemon is stopping

    def _memory(self) -> Memory:
        cfg = self.cfg
        capacities = [self.capacity(g.index) for g in self.gpus]
        capacity = min(capacities, default=0)
        if cfg.memory_room_gib is not None and 0 < capacity < cfg.room_bytes(capacity):
            # A room no GPU can free: every region beside siblings would wait room_wait_s.
            raise ConfigError(
                f"{cfg.source}: memory.room_gib = {cfg.memory_room_gib:g} is more than the "
                f"GPU's memory ({capacity / (1 << 30):.1f} GiB)"
            )
        return Memory(
            self,
            capacities,
            headroom=cfg.headroom_bytes(),
            headroom_each=cfg.headroom_each_bytes(),
            deadlock_s=cfg.memory_deadlock_s,
            learned=self.socket.parent / f"{self.socket.name}.peaks.json",
            room=cfg.room_bytes(capacities[0]) if capacities else 0,
            room_wait_s=cfg.memory_room_wait_s,
            unknown=cfg.unknown_bytes(capacity),
        )

    def capacity(self, gpu: int) -> int:
        """GPU memory in bytes: NVML's total; on the simulated GPU, KREX_SIM_MEM_BYTES (what
        the simulated driver reads) or its default; 0 where unknown."""
        if self.cfg.sim:
            text = os.environ.get("KREX_SIM_MEM_BYTES", "")
            return sim_mem_bytes(text) if text else SIM_MEM
        info = self.nvml.memory(gpu) if self.nvml is not None else None
        return info[0] if info else 0

    def stopping(self) -> bool:
        return self.stop.is_set()

    # What the memory arbiter asks (MemoryNode).
    def slots(self) -> Iterable[tuple[Pokable, Any]]:
        return self.segments.live_slots()

    def region_owner(self, gpu: int) -> Tenant | None:
        r = self.regions.held(gpu) or self.regions.setting_up(gpu)
        return r.tenant if r is not None else None

    def owner_stuck(self, gpu: int, waited_s: float, can_free: bool = True) -> None:
        """The region's owner waits for memory its frozen siblings hold: the region is revoked
        and, where `krex run` will run the command again anyway (what it times now is not what
        it would time alone), the command is preempted at once: what it holds goes back to the
        waiting siblings instead of being held while it finishes a run whose figures are void
        (on an H100, 2026-12-06, such owners went on waiting for memory, and the siblings with
        them, until a deadlock was broken seconds later). A timing call that asked for a retake
        is let wait and time again instead, where some process holding memory still runs
        (`can_free`: thawed, it may free); where every one waits, nothing would come back but by
        a preemption: the owner's, at once (on the simulated GPU, retakes there cost a third of
        the throughput, each revocation followed by a deadlock 1 s later); and so for a command
        younger than `memory.retake_after_s`, which loses less by running again than it would
        by holding its memory through the wait."""
        r = self.regions.held(gpu)
        if r is not None and r.granted and not r.ended:
            t = r.tenant
            t.mem_revoked += 1  # its command runs again (krex/client/run.py), unless retaken
            why = f"the owner waited {waited_s:.1f} s for device memory its frozen siblings hold"
            self.regions.revoke(r, why)
            age_s = time.monotonic() - t.t_admit
            if r.retake and can_free and age_s >= self.cfg.memory_retake_after_s and r.record:
                # A timing call the tenant times again in a new region once its wait is over
                # (krex/tenant/markers.py): only that call's work is lost, not the command's.
                t.mem_retakes.append(r.record)
                log.info("tenant %d times its call again in a new region (a retake)", t.id)
                for tell in r.notify:  # its holders that asked: told only where it is granted
                    tell(why)
            elif t.mem_retry:
                self.preempt(t.id, f"its region was revoked: {why}")

    def retaken(self, t: Tenant) -> None:
        """t begins a region that times again a call whose region was revoked for memory: that
        revocation no longer makes its command run again; its record says `retaken`."""
        if t.mem_retakes:
            t.mem_retakes.pop()["retaken"] = True

    def victims(self, gpu: int) -> list[Tenant]:
        """The commands on a GPU the memory arbiter may preempt, in the order it would: the
        youngest first (it lost the least work), a command already rerun last; never one that
        has the GPU's memory to itself, nor one whose region holds the GPU."""
        owner = self.region_owner(gpu)
        ts = [
            t
            for t in self.tenants.values()
            if gpu in t.gpus and not t.gone and not t.mem_alone and t is not owner
        ]
        return sorted(ts, key=lambda t: (t.mem_rerun, -t.t_admit))

    def preempt(self, tid: int, why: str) -> bool:
        """End command `tid` to break a memory deadlock (krex/daemon/memory.py): its processes are
        killed, its report says why, and `krex run` runs it again from the start."""
        t = self.tenants.get(tid)
        if t is None or t.gone or t.preempted:
            return False
        pids = t.group.pids()
        if not pids:
            return False
        t.preempted = why
        mine = self._slots_of(tid)
        held = max(sum(s.mem_bytes for s in mine), t.device_bytes or 0)
        # (What all its waiting processes ask for: they needed it at once, as a swap's.)
        t.preempted_need = held + command_asks(mine)
        log.warning(
            "tenant %d preempted (it runs again from the start): %s; killing %s",
            tid,
            why,
            pids,
        )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.swaps.forget(tid)
        return True

    def _slots_of(self, tid: int) -> list[SlotView]:
        """Command `tid`'s live process slots."""
        return [s for _, s in self.segments.live_slots() if s.alive and s.tenant == tid]

    def swap_out(
        self, tid: int, gpu: int, why: str, want: int, since_ns: int, blocked: int
    ) -> bool:
        """Take command `tid`, which waits for `want` bytes more, off `gpu` to break a memory
        deadlock, `blocked` others waiting there (krex/daemon/swap.py): False where it cannot
        be (it is then preempted)."""
        t = self.tenants.get(tid)
        if t is None or t.gone or t.preempted:
            return False
        mine = self._slots_of(tid)
        users = self.machinery.device_users(gpu)
        if users is not None:
            pids = sorted({s.pid for s in mine if users.get(s.pid, 0) > 0})
            held = sum(users.get(p, 0) for p in pids)
        else:
            pids = sorted({s.pid for s in mine if s.mem_bytes > 0})
            held = sum(s.mem_bytes for s in mine)
        held = max(held, sum(s.mem_bytes for s in mine))
        # Its work so far: its time since admission less its waits for memory, those over
        # and those going on (a first-wave command that mostly waited loses little).
        now_ns = time.monotonic_ns()
        going = [s.mem_since_ns for s in mine if s.mem_want and s.mem_since_ns]
        waited = self.segments.totals(t).mem_wait_ns
        work = work_s(now_ns / 1e9 - t.t_admit, waited, going, now_ns)
        not_swapped = self.swaps.can_take(t, held, work, blocked) or (
            "" if pids else "none of its processes holds memory on the GPU"
        )
        if not_swapped:
            log.info("tenant %d is not swapped out (%s)", tid, not_swapped)
            return False
        self.swaps.take_off(t, gpu, pids, held, held + want, since_ns, why)
        return True

    def _swap_refused(self, tid: int, why: str) -> None:
        """A command could not be taken off (or its swap failed): preempted, as before swaps."""
        t = self.tenants.get(tid)
        if t is not None and not t.gone and not self.preempt(tid, why):
            log.warning("tenant %d: no process to preempt after its swap (%s)", tid, why)

    def device_free(self, gpu: int) -> int | None:
        """The driver's free bytes (NVML: contexts and library workspaces included)."""
        info = self.nvml.memory(gpu) if self.nvml is not None else None
        return info[0] - info[1] if info else None

    def device_users(self, gpu: int) -> dict[int, int] | None:
        return self.machinery.device_users(gpu)

    # Tenants.
    def tenant_env(self, t: Tenant, auto: str | None) -> dict[str, str]:
        """The environment a tenant's command (or a pool worker) starts with (protocol.md)."""
        visible = ",".join(map(str, t.gpus))
        env = {
            "KREX_SOCKET": str(self.socket),
            "KREX_TENANT": str(t.id),
            "KREX_GPU": visible,
            "KREX_SHM": self.segments.gates.name,
        }
        if t.id in self.segments.tenants:
            env["KREX_SLOTS"] = self.segments.name_of(t.id)
        if self.vendor == "amd":
            # HIP: bindings routed by the audit module to the wrappers of libkrex-hip.so, which
            # exports no HIP name (docs/hip.md). Its GPUs only, as HIP devices 0, 1, ...
            env["LD_AUDIT"] = str(hip_audit_library())
            env["LD_PRELOAD"] = str(hip_shim_library())
            env["HIP_VISIBLE_DEVICES"] = visible
        else:
            env["LD_PRELOAD"] = str(shim_library())
        # Its GPUs only, as devices 0, 1, ... (the simulated drivers read this too: the
        # simulated HIP runs on the simulated CUDA).
        env["CUDA_VISIBLE_DEVICES"] = visible
        env["KREX_MEM_WAIT_S"] = f"{self.cfg.memory_wait_s:g}"
        if self.cfg.region_pace_ms > 0:  # the shim's pacing (docs/shim.md, "Pacing")
            env["KREX_PACE_US"] = str(round(self.cfg.region_pace_ms * 1000))
        if self.cfg.sim:
            env["LD_LIBRARY_PATH"] = str(sim_library_dir())
            if os.environ.get("KREX_SIM_MEM_BYTES"):
                env["KREX_SIM_MEM_BYTES"] = os.environ["KREX_SIM_MEM_BYTES"]
            env["KREX_SIM_SHM"] = sim_segment(self.segments.gates.name)
            env["KREX_SIM_GPUS"] = str(len(self.gpus))
        else:
            # PCI bus order: the same GPU numbering as NVML (CUDA's default is fastest first).
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env.update(self.mps.env() if self.mps is not None else {})
        if auto:
            from krex.tenant.autoregions import env_for

            try:
                # base={}: the client puts its own PYTHONPATH after ours.
                env.update(env_for([n for n in auto.split(",") if n], base={}))
            except ValueError as e:
                raise ProtocolError(f"auto_regions: {e}") from e
        return env

    def add_tenant(self, gpus: list[Gpu], req: AdmitRequest) -> Tenant:
        """A tenant, with its group and slot segment, for a command that holds a slot on each
        of gpus. ProtocolError when they cannot be made (the slots stay the caller's)."""
        try:
            # An id whose slot-segment name is free (one someone else planted is skipped).
            tid, _ = self.segments.new_tenant(_TENANT_SLOTS)
        except (SegmentError, OSError) as e:
            raise ProtocolError(f"cannot set up the tenant: {e}") from e
        try:
            group = TenantGroup.create(self.freezer, self.root, tid)
        except KrexError as e:
            self.segments.discard(tid)
            raise ProtocolError(f"cannot set up the tenant: {e}") from e
        t = Tenant(
            id=tid,
            gpu=gpus[0].index,
            gpus=[x.index for x in gpus],
            argv=req.argv,
            group=group,
            region_timeout_s=req.region_timeout_s,
            region_settle_s=req.settle,
            region_capped_settle_s=req.capped_settle,
            t_admit=time.monotonic(),
            mem_declared=req.mem,
            mem_alone=req.alone,
            mem_rerun=req.rerun,
            mem_rerun_need=req.rerun_need,
            mem_key=req.key,
            mem_family=req.family,
            mem_retry=req.retry,
        )
        self.tenants[tid] = t
        for x in gpus:
            self.admission.reserve(x, req, -1)
            x.tenants.append(t)
            self.metrics.admitted(x.index)
        log.info("admitted tenant %d on GPU %s: %s", tid, gpu_names(t.gpus), " ".join(t.argv)[:200])
        return t

    async def started(self, t: Tenant, pid: int) -> None:
        """Process pid is t's (its command, or the worker running it): into t's group, onto
        its cores, and frozen into any region another tenant holds on t's GPUs."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, t.group.add, pid)
            await loop.run_in_executor(None, t.group.pin, self.regions.cores(t))
        except TenantsError as e:
            raise ProtocolError(f"cannot place process {pid}: {e}") from e
        t.pids.append(pid)
        joined = self.regions.tenant_joined(t)
        if joined is not None:
            await joined

    def release(self, t: Tenant) -> None:
        """t's command is over (or its client gone): its region ends, its slots go to the
        next in line."""
        if t.gone:
            return
        t.gone = True
        self.swaps.forget(t.id)
        self.regions.tenant_left(t)
        if t.worker is not None:
            # Its child may still be tearing down: into the pool tenant before ours goes.
            self.pool.adopt(t, killed=t.child_lost)
        self.account()
        self.segments.retire(t.id)  # goes once its last process has exited
        self.account()
        t.group.destroy()
        del self.tenants[t.id]
        for i in t.gpus:
            g = self.gpus[i]
            g.tenants.remove(t)
            self.metrics.finished(i)
            self.admission.admit_next(g)
        log.info("tenant %d left GPU %s", t.id, gpu_names(t.gpus))

    def account(self) -> None:
        self.segments.account(self.tenants, draining=self.regions.busy())

    def report(self, t: Tenant) -> dict[str, Any]:
        """What `finished` is answered with (docs/protocol.md)."""
        self.account()
        total = self.segments.totals(t)
        self.memory.learn(t, max(total.mem_peak + t.driver_peak, total.device_peak or 0))
        report: dict[str, Any] = {
            "tenant": t.id,
            "gpu": t.gpu,
            "intercepted": total.intercepted,
            "blocked": total.blocked,
            "regions": list(t.regions),
            "freezer": self.freezer.value,
            "memory": _memory_report(total),
        }
        if t.preempted:
            report["preempted"] = {"why": t.preempted, "need_bytes": t.preempted_need}
        return report

    # The reaper's once-a-second look.
    def sample_device(self) -> None:
        """Each tenant's device bytes as the driver counts them (NVML's per-process figure, or
        the simulated driver's: its live processes' sum), and the largest seen: beside the
        shim's own count in status and reports, so a path the shim missed, or the driver's own
        memory (contexts, modules), shows as a gap between the two; learned peaks and
        admission use the larger."""
        live = self.segments.live_by_tenant()
        for g in self.gpus:
            used = self.machinery.device_users(g.index)
            if used is None:
                continue
            after = self.segments.live_by_tenant()
            for t in g.tenants:
                n = sum(used.get(s.pid, 0) for s in live.get(t.id, []))
                t.device_bytes = n
                t.device_peak = max(t.device_peak or 0, n)
                if len(t.gpus) == 1:
                    # The driver's own part (contexts, modules, local memory): what it counts
                    # beyond the shim. The shim's count read before and after the driver's, the
                    # larger kept: an allocation between the reads is never taken for the
                    # driver's. A sample can miss a short peak; this part added to the shim's
                    # peak (exact) does not.
                    shim = max(_shim_bytes(live, t.id), _shim_bytes(after, t.id))
                    t.driver_bytes = max(0, n - shim)
                    t.driver_peak = max(t.driver_peak, t.driver_bytes)
                if self.nvml is not None:
                    t.nvml_bytes = n
                    t.nvml_peak = max(t.nvml_peak or 0, n)

    def prune(self) -> None:
        """Remove the groups of tenants that outlived a predecessor daemon, once empty."""
        keep = {t.id for t in self.tenants.values()}
        keep |= {g.pool_tenant.id for g in self.gpus if g.pool_tenant is not None}
        keep |= {g.zygotes.tenant for g in self.gpus if g.zygotes is not None}
        with contextlib.suppress(TenantsError):
            prune(self.root, keep)

    async def close(self) -> None:
        """At shutdown: regions ended, the pool stopped, every gate open, every group gone
        (the segments stay mapped until the daemon's connections are over)."""
        cfg = self.cfg
        # A region being set up has threads quiescing and draining on the segments' mappings:
        # it finishes first (each of its waits is bounded), then every region ends.
        bound = cfg.quiesce_timeout_s + cfg.drain_timeout_s + cfg.freeze_timeout_s + 5.0
        await self.regions.shutdown(bound)
        await self.swaps.close()
        await self.pool.stop()
        for g in self.gpus:
            self.segments.gates.gate_open(g.index)
        for t in list(self.tenants.values()):
            t.group.destroy()
        if self.mps is not None:
            self.mps.stop()
        if self.nvml is not None:
            self.nvml.close()


def _shim_bytes(live: dict[int, list[SlotView]], tenant: int) -> int:
    return sum(s.mem_bytes for s in live.get(tenant, []))


def _memory_report(t: Tenant) -> dict[str, Any]:
    """A report's `memory` (docs/memory.md): peak, waits (per kind of call), and
    out-of-memory errors the command saw, split into those it would have had alone and those
    only sharing caused; NVML's peak and the driver's (NVML's, or the simulated driver's;
    sampled once a second, so at most the real one) as the cross-check."""
    retaken = sum(bool(rec.get("retaken")) for rec in t.regions)  # not run again for those
    return {
        "peak_bytes": t.mem_peak,
        "nvml_peak_bytes": t.nvml_peak,
        "device_peak_bytes": t.device_peak,
        "declared_bytes": t.mem_declared or None,
        "wait_s": t.mem_wait_ns / 1e9,
        "waits": t.mem_waits,
        "waits_by_kind": {
            kind: n for kind, n in zip(MEM_KINDS, t.mem_kind_waits, strict=False) if n
        },
        "oom_alone": t.mem_oom_alone,
        "oom_shared": t.mem_oom_shared,
        "revoked_regions": t.mem_revoked - retaken,
        "retaken_regions": retaken,
        "swaps": t.mem_swaps,
        "swapped_s": round(t.mem_swapped_s, 3),
        "off_gpu_s": round(t.mem_off_s, 3),
    }


def node_plan(cfg: Config) -> tuple[int, list[Slice]]:
    """The GPUs this daemon serves and each one's CPU slice: configured, or derived from the
    machine (the GPUs the driver shows, the cores this process may run on). ConfigError when
    they do not fit."""
    vendor = resolve_vendor(cfg)
    n = cfg.gpu_count or (1 if cfg.sim else detect_gpus(vendor))
    if n == 0:
        name = "AMD" if vendor == "amd" else "NVIDIA"
        raise ConfigError(f"no {name} GPU found: run with --sim for the simulated GPU")
    available = os.sched_getaffinity(0)
    slices = default_slices(n, set(available))
    for gpu, s in cfg.slices.items():
        if gpu >= n:
            raise ConfigError(f"{cfg.source}: slices.{gpu}: there are only {n} GPUs")
        slices[gpu] = Slice(gpu=gpu, region_cores=s.region, shared_cores=s.shared)
    try:
        # Defaults may share cores when there are more GPUs than cores; configured ones not.
        validate_slices(slices, set(available), allow_overlap=not cfg.slices)
    except SliceError as e:
        raise ConfigError(f"{cfg.source}: slices: {e}") from e
    return n, slices


def resolve_vendor(cfg: Config) -> str:
    """nvidia or amd: configured, else NVIDIA where nvidia-smi is, AMD where only ROCm is
    (simulated GPUs are NVIDIA's unless configured)."""
    if cfg.vendor != "auto":
        return cfg.vendor
    if cfg.sim or shutil.which("nvidia-smi"):
        return "nvidia"
    if Path("/dev/kfd").exists() or shutil.which("amd-smi") or shutil.which("rocm-smi"):
        return "amd"
    return "nvidia"


KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


def detect_gpus(vendor: str = "nvidia") -> int:
    """GPUs the driver shows (0 when there is no driver). AMD: the KFD topology's GPU nodes,
    as ROCm counts them (untested on AMD hardware)."""
    if vendor == "amd":
        with contextlib.suppress(Exception):  # hip-python (krex[hip]), where installed
            hip = importlib.import_module("hip.hip")
            err, n = hip.hipGetDeviceCount()
            if err == hip.hipError_t.hipSuccess:
                return int(n)
        count = 0
        with contextlib.suppress(OSError):
            for node in KFD_NODES.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    count += int((node / "gpu_id").read_text().strip() or 0) != 0
        return count
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))

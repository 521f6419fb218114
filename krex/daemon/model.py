"""The controller's data: GPUs, tenants, regions, region requests and pool workers.

Plain records with identity semantics (eq=False: two tenants are the same tenant only if they
are the same object). Who writes what: `krex.daemon.regions` alone writes region state (`Region`,
`Tenant.region`, the per-GPU request queues it keeps itself); the daemon writes admission,
tenants' processes and the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from krex.core.slices import Slice
from krex.core.tenants import TenantGroup


@dataclass(eq=False)
class Tenant:
    """One admitted command (or a GPU's pool of idle workers) and its process group."""

    id: int
    gpu: int  # the first of its GPUs
    argv: list[str]
    group: TenantGroup
    region_timeout_s: float
    t_admit: float
    # Idle this long after the freeze when siblings worked on the GPU just before (0: never).
    region_settle_s: float = 0.0
    # The same idle once one of its regions ran into the GPU's power or thermal limit
    # (`power_capped`): its kernels are power-limited ones, which read the siblings' heat.
    region_capped_settle_s: float = 0.0
    power_capped: bool = False
    gpus: list[int] = field(default_factory=list)  # all of them, ascending ([gpu] if unset)
    region: Region | None = None  # its region, being taken or held
    pids: list[int] = field(default_factory=list)
    regions: list[dict[str, Any]] = field(default_factory=list)  # records of ended regions
    intercepted: int = 0  # from process slots of its processes that are gone (reaped)
    blocked: int = 0
    gone: bool = False
    worker: PoolWorker | None = None  # the fork server that started its command (warm)
    child_lost: bool = False  # its warm child ended without reporting (a signal, a crash)
    # Device memory (docs/memory.md): the declared budget (krex run --mem, 0: none), and what
    # its processes that are gone did (folded from their process slots).
    mem_declared: int = 0
    mem_alone: bool = False  # admitted with the GPU's memory to itself (a second memory retry)
    mem_rerun: bool = False  # a rerun after a sharing out-of-memory: released last
    mem_rerun_need: int = 0  # what it is expected to need, from its failed run's peak
    mem_key: str = ""  # what identifies the command for its learned peak (krex/daemon/memory.py)
    mem_family: str = ""  # what it is, edited or not (its argv and directory): "" unknown
    mem_peak: int = 0
    mem_wait_ns: int = 0
    mem_waits: int = 0
    mem_oom_alone: int = 0
    mem_oom_shared: int = 0
    mem_revoked: int = 0  # its regions revoked: it waited for memory its frozen siblings held
    # Of those, the records of the ones whose retake was granted (region_begin's `retake`) and
    # not yet timed again; once timed again (`retaken`) a record says so: no rerun for those.
    mem_retakes: list[dict[str, Any]] = field(default_factory=list)
    mem_retry: bool = True  # krex run runs it again if preempted or revoked (Admit.mem_retry)
    mem_kind_waits: list[int] = field(default_factory=list)  # waits per kind (shm.MEM_KINDS)
    # NVML's per-process figure over its processes (the cross-check of the shim's count):
    # sampled once a second, None where NVML gives none (simulated GPU, no pynvml).
    nvml_bytes: int | None = None
    nvml_peak: int | None = None
    # The driver's own per-process figure over its processes (NVML's, or the simulated
    # driver's): what it really takes, contexts and modules included; None where unknown.
    device_bytes: int | None = None
    device_peak: int | None = None
    # The driver's part of that beyond the shim's count (its contexts, modules, local memory),
    # at the last sample and the most seen: a command's peak is the shim's (exact) plus this.
    driver_bytes: int = 0
    driver_peak: int = 0
    # Preempted by the memory arbiter to break a deadlock (why; "" when not): its processes
    # were killed and `krex run` runs it again (docs/memory.md).
    preempted: str = ""
    preempted_need: int = 0  # what it held and waited for then: its rerun's expected need
    # Swapped out to break a deadlock instead (krex/daemon/swap.py): how often, the seconds its
    # memory took to copy out and back, and the seconds it spent off the GPU.
    mem_swaps: int = 0
    mem_swapped_s: float = 0.0
    mem_off_s: float = 0.0

    def __post_init__(self) -> None:
        self.gpus = sorted(self.gpus) if self.gpus else [self.gpu]


@dataclass(eq=False)
class Region:
    """A tenant's region: the GPUs it holds and what taking them cost. A command of several
    GPUs takes them one at a time, in index order (so that two such commands never deadlock);
    the region is granted once it holds all of them, and ends on all of them at once."""

    tenant: Tenant
    t_request: float
    gpus: list[int] = field(default_factory=list)  # held so far, in the order taken
    epochs: dict[int, int] = field(default_factory=dict)
    t_grant: float = 0.0  # 0 until every GPU is held
    wait_s: float = 0.0
    t_setup: float = 0.0  # when its set-up began (its first GPU's room step)
    room_s: float = 0.0  # waited for room in device memory before closing the gates
    exit_s: float = 0.0  # its end: audits, pin back, thaw, gates open (measured)
    exit_steps: dict[str, float] = field(default_factory=dict)  # exit_s by step
    steps: dict[str, float] = field(default_factory=dict)  # set-up steps' own seconds
    freeze_s: float = 0.0  # measured
    awake: int = 0  # siblings' processes its freezes left running (regions.freeze = contexts)
    settle_s: float = 0.0  # waited after the freeze for the GPU to settle (region_settle_s)
    settle_capped: bool = False  # that settle was the power-capped command's (capped_settle_s)
    # Begun by an autotuner's candidate benchmark (region_begin's `candidate`): its choice is a
    # comparison, not a reported time, so the power-capped settle is not spent on it.
    candidate: bool = False
    frozen: list[Tenant] = field(default_factory=list)  # siblings on any of its GPUs
    # While a GPU's siblings drain, a process that joins them (a leased or returned pool
    # worker) is listed but frozen only at the freeze step: frozen earlier, its drain thread
    # could not answer a request already sent, and the drain would time out.
    draining: bool = False
    deferred: list[Tenant] = field(default_factory=list)
    clocks: dict[int, dict[str, int] | None] = field(default_factory=dict)  # at each grant
    memory: dict[int, tuple[int, int] | None] = field(default_factory=dict)  # at each grant
    # The grant's audit and samples per GPU, running beside the grant (krex/daemon/regions.py,
    # _join_checks): joined into problems, clocks and memory when the region ends.
    checks: list[Future[Any]] = field(default_factory=list)
    holders: int = 1  # connections of the owner in it (other threads nest)
    pids: list[int] = field(default_factory=list)  # the owner's processes that asked, in order
    calls: dict[str, int] = field(default_factory=dict)  # what its holders' markers were
    revoked: bool = False
    ended: bool = False
    record: dict[str, Any] | None = None
    timer: asyncio.TimerHandle | None = None
    problems: list[str] = field(default_factory=list)  # why it is not clean; empty: clean
    # How each holder whose timing call would be timed again in a new region if this one were
    # revoked for memory (region_begin's `retake`) is told, where the daemon grants the retake
    # (the event; krex/daemon/node.py, owner_stuck).
    notify: list[Callable[[str], None]] = field(default_factory=list)

    @property
    def granted(self) -> bool:
        return self.t_grant > 0

    @property
    def retake(self) -> bool:
        """A holder asked for a retake."""
        return bool(self.notify)

    @property
    def drain_s(self) -> float:
        """Measured: quiesce and drain, over its GPUs."""
        return self.steps.get("quiesce", 0.0) + self.steps.get("drain", 0.0)

    @property
    def clean(self) -> bool:
        return not self.problems


@dataclass(eq=False)
class RegionRequest:
    """One thread's request for one GPU of its tenant's region, waiting in that GPU's queue."""

    tenant: Tenant
    t_request: float
    granted: asyncio.Future[Region]  # the region, once it holds this request's GPU
    candidate: bool = False  # an autotuner's candidate benchmark asks (Region.candidate)


@dataclass(eq=False)
class PoolWorker:
    """A warm pool worker (krex/pool/worker.py: a fork server) as the daemon sees it."""

    id: int
    gpu: int
    proc: asyncio.subprocess.Process
    listen: Path
    secret: str
    t_start: float = 0.0
    state: str = "starting"  # starting, idle (serving), gone
    leases: int = 0  # commands it was asked to fork
    writer: asyncio.StreamWriter | None = None
    exited: asyncio.Future[int] | None = None

    def ready_s(self) -> float:
        return time.monotonic() - self.t_start


@dataclass(frozen=True)
class AdmitRequest:
    """What an `admit` asks for, checked."""

    argv: list[str]
    region_timeout_s: float  # the command's region time-out
    auto: str | None  # auto-regions
    mem: int  # declared device memory in bytes (krex run --mem), 0: none
    alone: bool = False  # a second memory rerun: admitted only with the GPU's memory to itself
    rerun: bool = False  # a first memory rerun (released last)
    rerun_need: int = 0  # what that rerun is expected to need (bytes)
    key: str = ""  # the command's identity for learned peaks (the client's, else its argv's)
    family: str = ""  # its argv and directory's, for a command never seen (the client's)
    settle: float = 0.0  # its regions' settle (krex run --settle, else regions.settle_s)
    capped_settle: float = 0.0  # once power-capped (--capped-settle, else regions.capped_settle_s)
    retry: bool = True  # krex run runs the command again if preempted or revoked for memory


@dataclass(eq=False)
class AdmissionTicket:
    """A command waiting for one of a GPU's admission slots."""

    granted: asyncio.Future[None]
    req: AdmitRequest


@dataclass(eq=False)
class Gpu:
    """One GPU of the node: its admission slots and queue, its CPU slice and its pool."""

    index: int
    slots: int  # commands admitted at once (admission slots, not process slots)
    slice: Slice
    tenants: list[Tenant] = field(default_factory=list)
    admission: deque[AdmissionTicket] = field(default_factory=deque)
    reserved: int = 0  # admission slots promised to commands being admitted
    # What each of those commands was expected to need when promised (by its request's id),
    # taken back exactly: an expectation can change before admission (a peak learned).
    promised_mem: dict[int, int] = field(default_factory=dict)
    reserved_alone: int = 0  # of those, commands that must have the GPU's memory to themselves
    pool: list[PoolWorker] = field(default_factory=list)
    pool_tenant: Tenant | None = None  # warm commands' leftovers tearing down (frozen in regions)
    zygotes: TenantGroup | None = None  # the fork servers' group: pinned, never frozen
    pool_failures: int = 0  # workers in a row that died before they were ready
    warm_runs: int = 0
    cold_runs: int = 0

    @property
    def reserved_mem(self) -> int:
        """The memory the commands promised a slot are expected to need."""
        return sum(self.promised_mem.values())

    def load(self) -> int:
        """Commands on it, promised to it, or waiting for it."""
        return len(self.tenants) + self.reserved + len(self.admission)


def gpu_names(gpus: list[int]) -> str:
    """GPU indices as the logs write them (0,1)."""
    return ",".join(map(str, gpus))

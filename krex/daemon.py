"""`krex daemon`: the per-node controller (admission, tenants, the region protocol, reports).

One asyncio loop owns all state; the blocking steps of the region protocol (quiesce, drain,
freeze) run in worker threads. Per GPU there is a FIFO admission queue for slots and a FIFO
region queue: regions are granted in request order and each lasts at most its time-out, so a
request waits at most (requests ahead of it) x (their time-outs) and no tenant starves.
docs/protocol.md is the wire protocol; design.md the region protocol and its invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import functools
import importlib.util
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from krex import __version__
from krex.config import Config, ConfigError
from krex.errors import KrexError
from krex.gate import Hold, quiesce_and_drain
from krex.metrics import Metrics, MetricsError
from krex.nvml import Nvml, throttled
from krex.paths import (
    hip_audit_library,
    hip_shim_library,
    shim_library,
    sim_hip_available,
    sim_library_dir,
)
from krex.pool import preinit
from krex.shm import Segment, SegmentError
from krex.slices import Slice, SliceError, default_slices, validate_slices
from krex.tenants import (
    FreezerKind,
    TenantGroup,
    TenantsError,
    detect_freezer,
    prune,
    recover,
)

log = logging.getLogger("krex.daemon")

MAX_LINE = 64 * 1024
PROTOCOL_VERSION = 1
GATE_GRACE_S = 30.0  # blocked threads pass on their own this long after a region's time-out


class ProtocolError(Exception):
    """A request that cannot be served; its message goes back to the client."""


@dataclass
class RegionRequest:
    tenant: Tenant
    writer: asyncio.StreamWriter
    t_request: float
    granted: asyncio.Future[Region]  # the region, once it holds this request's GPU


@dataclass
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
    drain_s: float = 0.0
    freeze_s: float = 0.0
    clean: bool = True
    frozen: list[Tenant] = field(default_factory=list)  # siblings on any of its GPUs
    # While a GPU's siblings drain, a process that joins them (a leased or returned pool
    # worker) is listed but frozen only at the freeze step: frozen earlier, its drain thread
    # could not answer a request already sent, and the drain would time out.
    draining: bool = False
    deferred: list[Tenant] = field(default_factory=list)
    clocks: dict[int, dict[str, int] | None] = field(default_factory=dict)  # at each GPU's grant
    holders: int = 1  # connections of the owner in it (other threads nest)
    revoked: bool = False
    ended: bool = False
    record: dict[str, Any] | None = None
    timer: asyncio.TimerHandle | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def granted(self) -> bool:
        return self.t_grant > 0


@dataclass
class Tenant:
    id: int
    gpu: int  # the first of its GPUs
    argv: list[str]
    group: TenantGroup
    region_timeout_s: float
    t_admit: float
    gpus: list[int] = field(default_factory=list)  # all of them, ascending ([gpu] if unset)
    region: Region | None = None  # its region, being taken or held
    pids: list[int] = field(default_factory=list)
    regions: list[dict[str, Any]] = field(default_factory=list)
    intercepted: int = 0  # from slots of its processes that are gone (reaped)
    blocked: int = 0
    gone: bool = False
    worker: Worker | None = None  # the warm worker running its command

    def __post_init__(self) -> None:
        self.gpus = sorted(self.gpus) if self.gpus else [self.gpu]


@dataclass
class Worker:
    """A warm pool worker (krex/worker.py) and where it stands."""

    id: int
    gpu: int
    proc: asyncio.subprocess.Process
    listen: Path
    secret: str
    t_start: float
    state: str = "starting"  # starting, idle, busy, retiring, gone
    slot: int = -1
    uses: int = 0
    writer: asyncio.StreamWriter | None = None
    tenant: Tenant | None = None
    exited: asyncio.Future[int] | None = None
    slots_id: int = 0  # its own slot segment's id: apart from every other worker's


@dataclass
class Gpu:
    index: int
    slots: int
    slice: Slice
    tenants: list[Tenant] = field(default_factory=list)
    admission: deque[asyncio.Future[None]] = field(default_factory=deque)
    requests: deque[RegionRequest] = field(default_factory=deque)
    region: Region | None = None
    pending: Region | None = None  # the region being set up here (busy)
    busy: bool = False  # a region is being set up here
    reserved: int = 0  # slots promised to commands being admitted
    pool: list[Worker] = field(default_factory=list)
    pool_tenant: Tenant | None = None  # the group idle workers wait in (frozen in regions)
    pool_failures: int = 0  # workers in a row that died before they were ready
    warm_runs: int = 0
    cold_runs: int = 0


def node_plan(cfg: Config) -> tuple[int, list[Slice]]:
    """The GPUs this daemon serves and each one's CPU slice: configured, or derived from the
    machine (the GPUs the driver shows, the cores this process may run on). ConfigError when
    they do not fit."""
    vendor = resolve_vendor(cfg)
    n = cfg.gpu_count or (1 if cfg.sim else _detect_gpus(vendor))
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


def _detect_gpus(vendor: str = "nvidia") -> int:
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


class Daemon:
    """The controller of one node (or of one simulated node)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.socket = cfg.socket_path()
        self.root = cfg.segment_name().lstrip("/")
        self._lock_fd: int | None = None
        # First of all: a second daemon on this socket must not touch the segment or the
        # cgroups of the running one (recovery reopens gates and thaws groups).
        self._take_lock()
        n, slices = node_plan(cfg)
        try:
            self.freezer: FreezerKind = detect_freezer(cfg.freezer)
        except TenantsError as e:
            raise ConfigError(f"{cfg.source}: freezer.backend: {e}") from e
        self.gpus = [Gpu(index=i, slots=cfg.slots, slice=slices[i]) for i in range(n)]
        self.tenants: dict[int, Tenant] = {}
        self.next_tenant = 1
        self.accounted: set[tuple[str, int, int]] = set()
        self.seg = self._segment(n)
        self.seg_inode = _inode(self.seg.name)
        # Each tenant's processes take their slots from a segment of the tenant's own (the
        # gates' segment is read-only to them): by tenant id, and those of tenants gone whose
        # processes have not all exited yet (or that a predecessor daemon left).
        self.slot_segs: dict[int, Segment] = {}
        self.orphan_segs: list[Segment] = self._adopt_slot_segments()
        self.mps_dir: Path | None = None
        self.vendor = resolve_vendor(cfg)
        if self.vendor == "amd" and cfg.sim and not sim_hip_available():
            raise ConfigError("the simulated HIP runtime (libamdhip64.so) is not built: make build")
        self.nvml = None if cfg.sim or self.vendor == "amd" else Nvml.open()
        self._server: asyncio.AbstractServer | None = None
        self._stopping: asyncio.Event | None = None
        self.workers: dict[int, Worker] = {}
        self.next_worker = 1
        self.preload = [m for m in cfg.preload() if importlib.util.find_spec(m) is not None]
        self.metrics = Metrics(n)
        if cfg.metrics_port:
            try:
                self.metrics.serve(cfg.metrics_port, cfg.metrics_address)
            except MetricsError as e:
                raise ConfigError(f"{cfg.source}: metrics: {e}") from e

    # Start-up and shutdown.
    def _segment(self, n: int) -> Segment:
        name = self.cfg.segment_name()
        try:
            seg = Segment.attach(name)
        except SegmentError:
            seg = None
        if seg is not None and seg.n_gpus == n:
            # A predecessor died: its gates may be closed and its tenants frozen. Reopen and
            # thaw everything; tenants that are still running carry on with this segment.
            for g in range(n):
                seg.gate_open(g)
            thawed = recover(self.root)
            self.next_tenant = 1 + max((s.tenant for s in seg.slots()), default=0)
            log.warning("recovered segment %s: gates reopened, %d group(s) thawed", name, thawed)
            return seg
        if seg is not None:
            seg.close()
        _unlink(name)
        recover(self.root)
        # Readable by all (gates are no secret; tenants map them read-only), writable by us.
        return Segment.create(
            name, n_gpus=n, n_slots=min(4096, max(64, 16 * n * self.cfg.slots)), mode=0o644
        )

    def _slots_name(self, tid: int) -> str:
        return f"{self.seg.name}-t{tid}"

    def _adopt_slot_segments(self) -> list[Segment]:
        """Tenants' slot segments a crashed predecessor left: keep draining their live slots."""
        adopted = []
        prefix = self.seg.name.lstrip("/") + "-t"
        with contextlib.suppress(OSError):
            for entry in os.listdir("/dev/shm"):
                if not (entry.startswith(prefix) and entry[len(prefix) :].isdigit()):
                    continue
                self.next_tenant = max(self.next_tenant, int(entry[len(prefix) :]) + 1)
                try:
                    seg = Segment.attach("/" + entry)
                except SegmentError:
                    _unlink("/" + entry)
                    continue
                if any(s.alive for s in seg.slots()):
                    adopted.append(seg)
                else:
                    seg.unlink()
                    seg.close()
        return adopted

    def _new_slot_segment(self, tid: int, slots: int) -> Segment:
        name = self._slots_name(tid)
        _unlink(name)  # a stale one of a predecessor's tenant with this id
        seg = Segment.create(name, n_gpus=len(self.gpus), n_slots=slots)
        self.slot_segs[tid] = seg
        return seg

    def _segments(self) -> list[Segment]:
        """Every segment that holds slots: the gates' own (older shims, tests), each tenant's,
        and those of tenants gone whose processes linger."""
        return [self.seg, *self.slot_segs.values(), *self.orphan_segs]

    def _take_lock(self) -> None:
        self.socket.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(str(self.socket) + ".pid", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"another krex daemon is running on {self.socket}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _start_mps(self) -> None:
        control = shutil.which("nvidia-cuda-mps-control")
        if not control:
            raise ConfigError("mps.enabled is set but nvidia-cuda-mps-control is not on PATH")
        self.mps_dir = self.socket.parent / f"mps-{self.root}"
        for sub in ("pipe", "log"):
            (self.mps_dir / sub).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, **self._mps_env())
        subprocess.run([control, "-d"], env=env, check=True, timeout=30)
        log.info("started MPS (pipe directory %s)", self.mps_dir / "pipe")

    def _mps_env(self) -> dict[str, str]:
        if self.mps_dir is None:
            return {}
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.mps_dir / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(self.mps_dir / "log"),
        }

    def _stop_mps(self) -> None:
        control = shutil.which("nvidia-cuda-mps-control")
        if self.mps_dir is None or not control:
            return
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [control],
                input="quit\n",
                text=True,
                timeout=30,
                env=dict(os.environ, **self._mps_env()),
            )

    async def serve(self) -> None:
        """Serve until SIGTERM or SIGINT; then thaw everything, open every gate, and exit."""
        if self.cfg.mps and not self.cfg.sim:
            self._start_mps()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self._stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        self._server = await asyncio.start_unix_server(
            self._client, path=str(self.socket), limit=MAX_LINE
        )
        os.chmod(self.socket, 0o600)
        log.info(
            "krex daemon %s on %s: %d %s%s GPU(s), %d slots each, freezer %s, segment %s",
            __version__,
            self.socket,
            len(self.gpus),
            "simulated " if self.cfg.sim else "",
            "AMD" if self.vendor == "amd" else "NVIDIA",
            self.cfg.slots,
            self.freezer.value,
            self.seg.name,
        )
        reaper = asyncio.create_task(self._reap_loop())
        try:
            self._start_pools()
            await self._stopping.wait()
        finally:
            reaper.cancel()
            await self._shutdown()

    async def _shutdown(self) -> None:
        log.info("stopping: ending regions, thawing tenants, opening gates")
        if self._server is not None:
            self._server.close()
        # A region being set up has threads quiescing and draining on the segments' mappings:
        # let them finish (each wait is bounded) before anything is closed.
        bound = (
            self.cfg.quiesce_timeout_s + self.cfg.drain_timeout_s + self.cfg.freeze_timeout_s + 5.0
        )
        deadline = time.monotonic() + bound
        while any(g.busy for g in self.gpus) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await self._stop_pools()
        for g in self.gpus:
            if g.region is not None:
                self._finish_region(g.region, revoked=True, why="daemon stopping")
            self.seg.gate_open(g.index)
        for t in list(self.tenants.values()):
            t.group.destroy()
        self._stop_mps()
        if self.nvml is not None:
            self.nvml.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        for seg in [*self.slot_segs.values(), *self.orphan_segs]:
            # Left for a successor to adopt while processes still use it.
            if not any(s.alive for s in seg.slots()):
                seg.unlink()
            seg.close()
        if not any(s.alive for s in self.seg.slots()):
            self.seg.unlink()
        self.seg.close()

    # Connections.
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            peer = _peer(writer)
            if peer.uid not in (os.getuid(), 0):
                # The socket is 0600 already; this also holds if its mode is ever loosened.
                raise ProtocolError(f"user {peer.uid} may not use this daemon")
            first = await self._read(reader)
            if first is None:
                return
            op = first.get("op")
            if op == "admit":
                await self._admit(first, reader, writer, peer)
            elif op == "region_begin":
                await self._region_conn(first, reader, writer, peer)
            elif op == "worker_ready":
                await self._worker_conn(first, reader, writer, peer)
            elif op == "hello":
                await self._send(writer, {"ok": True, "version": __version__, "pid": os.getpid()})
            elif op == "status":
                await self._send(writer, {"ok": True, **self.status()})
            else:
                raise ProtocolError(f"unknown op {op!r}")
        except ProtocolError as e:
            with contextlib.suppress(ConnectionError):
                await self._send(writer, {"ok": False, "error": str(e)})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug, not the client's fault: log it, answer, keep serving
            log.exception("request failed")
            with contextlib.suppress(ConnectionError, OSError):
                await self._send(writer, {"ok": False, "error": "internal error (see the log)"})
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> dict[str, Any] | None:
        try:
            line = await reader.readline()
        except (ValueError, asyncio.LimitOverrunError) as e:
            raise ProtocolError(f"request longer than {MAX_LINE} bytes") from e
        if not line:
            return None
        try:
            msg = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProtocolError("request is not one JSON object per line") from e
        if not isinstance(msg, dict):
            raise ProtocolError("request is not a JSON object")
        if msg.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {msg.get('v')!r} is not supported (want 1)")
        return msg

    async def _send(self, writer: asyncio.StreamWriter, msg: dict[str, Any]) -> None:
        writer.write(json.dumps(msg).encode() + b"\n")
        await writer.drain()

    # Admission.
    def _pick_gpus(self, wanted: Any, count: Any) -> list[Gpu]:
        """The GPUs a command asked for (`gpu`: an index or a list of them; `gpus`: how many),
        in index order; by default the least loaded."""
        n = len(self.gpus)
        if count is not None:
            if not _json_int(count) or count < 1:
                raise ProtocolError(f"gpus must be a positive integer, got {count!r}")
            if count > n:
                raise ProtocolError(f"{count} GPUs asked for, but this node has {n}")
        if wanted is not None:
            ids = [wanted] if not isinstance(wanted, list) else wanted
            if not ids or not all(_json_int(i) for i in ids):
                raise ProtocolError(f"gpu must be a GPU index or a list of them, got {wanted!r}")
            missing = [i for i in ids if not 0 <= i < n]
            if missing:
                raise ProtocolError(f"GPU {missing[0]} does not exist (this node has {n})")
            if len(set(ids)) != len(ids):
                raise ProtocolError(f"gpu names a GPU twice: {ids}")
            if count is not None and count != len(ids):
                raise ProtocolError(f"gpus={count} but gpu names {len(ids)}: {ids}")
            return [self.gpus[i] for i in sorted(ids)]
        load = sorted(self.gpus, key=lambda g: (self._load(g), g.index))
        return sorted(load[: count or 1], key=lambda g: g.index)

    @staticmethod
    def _load(g: Gpu) -> int:
        return len(g.tenants) + g.reserved + len(g.admission)

    async def _take_slot(
        self, g: Gpu, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Reserve one of g's slots (g.reserved), after waiting in its queue if all are taken."""
        if len(g.tenants) + g.reserved < g.slots and not g.admission:
            g.reserved += 1
            return
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.admission.append(ticket)
        await self._send(writer, {"ok": True, "queued": len(g.admission), "gpu": g.index})
        try:
            await self._until(ticket, reader)  # _admit_next reserves the slot for us
        except BaseException:
            if ticket in g.admission:
                g.admission.remove(ticket)
            elif ticket.done() and not ticket.cancelled():
                # We were handed a slot but are leaving: pass it on.
                g.reserved -= 1
                self._admit_next(g)
            raise

    async def _admit(
        self,
        msg: dict[str, Any],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Peer,
    ) -> None:
        argv = msg.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ProtocolError("argv must be a non-empty list of strings")
        if bool(msg.get("sim", False)) != self.cfg.sim:
            kind = "simulated" if self.cfg.sim else "real"
            raise ProtocolError(f"this daemon serves {kind} GPUs")
        timeout = msg.get("region_timeout_s")
        if timeout is None:
            timeout = self.cfg.region_timeout_s
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            raise ProtocolError("region_timeout_s must be a positive number")
        auto = msg.get("auto_regions")
        if auto is not None and not isinstance(auto, str):
            raise ProtocolError("auto_regions must be a string")
        if not self._segment_linked():
            # Running tenants keep their mapping and carry on; a new one would find no segment
            # and run ungated, so none is let in.
            raise ProtocolError(
                f"the shared segment {self.seg.name} was removed under the daemon: running "
                "commands finish, new ones cannot be gated; restart the daemon"
            )
        gpus = self._pick_gpus(msg.get("gpu"), msg.get("gpus"))
        held: list[Gpu] = []
        try:
            # One slot on each GPU, taken in index order: a command of several GPUs never holds
            # a slot while it waits for one that the holder of another slot waits for.
            for g in gpus:
                await self._take_slot(g, reader, writer)
                held.append(g)
            tid = self.next_tenant
            self.next_tenant += 1
            try:
                group = TenantGroup.create(self.freezer, self.root, tid)
                self._new_slot_segment(tid, 64)
            except (TenantsError, SegmentError, KrexError) as e:
                raise ProtocolError(f"cannot set up the tenant: {e}") from e
        except BaseException:
            for g in held:
                g.reserved -= 1
                self._admit_next(g)
            raise
        g = gpus[0]
        t = Tenant(
            id=tid,
            gpu=g.index,
            gpus=[x.index for x in gpus],
            argv=argv,
            group=group,
            region_timeout_s=float(timeout),
            t_admit=time.monotonic(),
        )
        self.tenants[tid] = t
        for x in gpus:
            x.reserved -= 1
            x.tenants.append(t)
            self.metrics.admitted(x.index)
        where = ",".join(map(str, t.gpus))
        log.info("admitted tenant %d on GPU %s: %s", tid, where, " ".join(argv)[:200])
        reply: dict[str, Any] = {"ok": True, "tenant": tid, "gpu": g.index, "gpus": t.gpus}
        reply["env"] = self._env(t, auto)
        if len(gpus) == 1 and (g.pool or self._pool_size()):
            # What a client needs to decide whether its command can run warm (krex/pool.py).
            reply["pool"] = {
                "python": sys.executable,
                "env": {k: v for k, v in os.environ.items() if preinit(k)},
            }
        try:
            await self._send(writer, reply)
            await self._tenant_conn(t, reader, writer, peer)
        finally:
            self._release(t)

    async def _until(self, fut: asyncio.Future[Any], reader: asyncio.StreamReader) -> None:
        """Wait for fut, but give up when the client goes away (EOF). The client says nothing
        while it waits, so the watch for EOF reads no request."""
        eof = asyncio.create_task(reader.read(1))
        try:
            done, _ = await asyncio.wait({fut, eof}, return_when=asyncio.FIRST_COMPLETED)
            if fut not in done or fut.cancelled():
                raise ConnectionError("client left while waiting")
        finally:
            eof.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                if await eof:
                    raise ProtocolError("nothing may be sent while waiting")

    def _admit_next(self, g: Gpu) -> None:
        """Hand free slots of g to the commands waiting for one (each reserved at once, so that
        nobody arriving meanwhile takes it)."""
        while g.admission and len(g.tenants) + g.reserved < g.slots:
            ticket = g.admission.popleft()
            if not ticket.done():
                g.reserved += 1
                ticket.set_result(None)

    def _env(self, t: Tenant, auto: str | None) -> dict[str, str]:
        env = {
            "KREX_SOCKET": str(self.socket),
            "KREX_TENANT": str(t.id),
            "KREX_GPU": ",".join(map(str, t.gpus)),
            "KREX_SHM": self.seg.name,
            **({"KREX_SLOTS": self._slots_name(t.id)} if t.id in self.slot_segs else {}),
        }
        visible = ",".join(map(str, t.gpus))
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
        if self.cfg.sim:
            env["LD_LIBRARY_PATH"] = str(sim_library_dir())
            env["KREX_SIM_SHM"] = self.seg.name + "-sim"
            env["KREX_SIM_GPUS"] = str(len(self.gpus))
        else:
            # PCI bus order: the same GPU numbering as NVML (CUDA's default is fastest first).
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env.update(self._mps_env())
        if auto:
            from krex.autoregions import env_for

            try:
                # base={}: the client puts its own PYTHONPATH after ours.
                env.update(env_for([n for n in auto.split(",") if n], base={}))
            except ValueError as e:
                raise ProtocolError(f"auto_regions: {e}") from e
        return env

    async def _tenant_conn(
        self, t: Tenant, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        while True:
            msg = await self._read(reader)
            if msg is None:
                return
            op = msg.get("op")
            if op == "started":
                pid = msg.get("pid")
                if not _json_int(pid) or pid <= 0:
                    raise ProtocolError("pid must be a positive integer")
                if t.pids or _parent(pid) != peer.pid:
                    # Only the command `krex run` itself forked, once: never someone else's
                    # process into a group that will be frozen.
                    raise ProtocolError(f"process {pid} is not this client's command")
                await self._started(t, pid)
                self.metrics.started(t.gpu, warm=False)
                await self._send(writer, {"ok": True, "freezer": self.freezer.value})
            elif op == "lease":
                await self._send(writer, {"ok": True, **await self._lease(t)})
            elif op == "finished":
                status = None
                if msg.get("worker_lost") and t.worker is not None:
                    status = await self._worker_status(t.worker)
                if t.worker is None:
                    self.gpus[t.gpu].cold_runs += 1
                report = self._report(t)
                await self._send(writer, {"ok": True, "report": report, "worker_status": status})
                return
            else:
                raise ProtocolError(f"unknown op {op!r} for a tenant")

    async def _started(self, t: Tenant, pid: int) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, t.group.add, pid)
            await loop.run_in_executor(None, t.group.pin, self._cores(t))
        except TenantsError as e:
            raise ProtocolError(f"cannot place process {pid}: {e}") from e
        t.pids.append(pid)
        for i in t.gpus:
            g = self.gpus[i]
            region = g.region or g.pending
            if region is None or region.tenant is t or t in region.frozen:
                continue
            # Joining while another tenant holds the GPU (or is taking it): it starts frozen
            # like its siblings. Listed first, so that a region ending meanwhile thaws it.
            region.frozen.append(t)
            if region.draining:
                region.deferred.append(t)  # the region's freeze step freezes it
                continue
            ok = await loop.run_in_executor(None, self._freeze, t)
            if region.ended or (region is not g.region and region is not g.pending):
                # The region ended (or let this GPU go) while we froze: its thaw may have come
                # before our freeze.
                if t in region.frozen:
                    region.frozen.remove(t)
                await loop.run_in_executor(None, self._thaw, t)
            elif not ok:
                region.clean = False
                region.problems.append(f"tenant {t.id} admitted during the region did not freeze")

    def _release(self, t: Tenant) -> None:
        if t.gone:
            return
        t.gone = True
        for i in t.gpus:
            g = self.gpus[i]
            for req in list(g.requests):
                if req.tenant is t:
                    g.requests.remove(req)
                    if not req.granted.done():
                        req.granted.cancel()
        if t.region is not None:
            self._finish_region(t.region, revoked=False, why="tenant finished")
        for g in self.gpus:
            for region in (g.region, g.pending):
                if region is not None and t in region.frozen:
                    region.frozen.remove(t)
        if t.worker is not None and t.worker.tenant is t:
            # Its worker may still be resetting: back to the pool's group before ours goes.
            self._return_to_pool(t.worker)
        self._account()
        seg = self.slot_segs.pop(t.id, None)
        if seg is not None:
            self.orphan_segs.append(seg)  # goes once its last process has exited
            self._account()
        t.group.destroy()
        del self.tenants[t.id]
        for i in t.gpus:
            g = self.gpus[i]
            g.tenants.remove(t)
            self.metrics.finished(i)
            self._admit_next(g)
        log.info("tenant %d left GPU %s", t.id, ",".join(map(str, t.gpus)))

    def _cores(self, t: Tenant) -> set[int]:
        """Where t runs: the region cores of the GPUs its region holds, else the shared cores
        of its GPUs."""
        if t.region is not None and t.region.gpus and not t.region.ended:
            return {c for i in t.region.gpus for c in self.gpus[i].slice.region_cores}
        return {c for i in t.gpus for c in self.gpus[i].slice.shared_cores}

    # Accounting.
    def _account(self) -> None:
        """Fold the counters of dead processes' slots into their tenants, then free the slots."""
        for seg in self._segments():
            for s in seg.slots():
                if s.alive or (seg.name, s.index, s.pid) in self.accounted:
                    continue
                owner = self.tenants.get(s.tenant)
                if owner is not None:
                    owner.intercepted += s.intercepted
                    owner.blocked += s.blocked
                self.accounted.add((seg.name, s.index, s.pid))
            seg.reap()
        # Not while a region is being set up: its quiesce and drain run on these mappings in a
        # worker thread.
        busy = any(g.busy for g in self.gpus)
        for seg in [] if busy else list(self.orphan_segs):
            if not any(s.alive for s in seg.slots()):
                self.orphan_segs.remove(seg)
                seg.unlink()
                seg.close()
        if len(self.accounted) > 100_000:
            self.accounted.clear()

    def _report(self, t: Tenant) -> dict[str, Any]:
        self._account()
        live = [s for seg in self._segments() for s in seg.slots() if s.tenant == t.id and s.alive]
        return {
            "tenant": t.id,
            "gpu": t.gpu,
            "intercepted": t.intercepted + sum(s.intercepted for s in live),
            "blocked": t.blocked + sum(s.blocked for s in live),
            "regions": list(t.regions),
            "freezer": self.freezer.value,
        }

    async def _reap_loop(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(1.0)
            self._account()
            for g in self.gpus:
                self.metrics.levels(
                    g.index,
                    queue=len(g.admission),
                    region_queue=len(g.requests),
                    slots=len(g.tenants),
                    idle=sum(w.state == "idle" for w in g.pool),
                )
            n += 1
            if n % 10 == 0:
                # Groups of tenants that outlived a predecessor daemon, once they are empty.
                keep = {t.id for t in self.tenants.values()}
                keep |= {g.pool_tenant.id for g in self.gpus if g.pool_tenant is not None}
                with contextlib.suppress(TenantsError):
                    prune(self.root, keep)

    # Regions.
    async def _region_conn(
        self,
        msg: dict[str, Any],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Peer,
    ) -> None:
        tid = msg.get("tenant")
        t = self.tenants.get(tid) if _json_int(tid) else None
        if t is None:
            raise ProtocolError(f"tenant {tid!r} is not admitted here")
        if peer.pid not in await asyncio.get_running_loop().run_in_executor(None, t.group.pids):
            # A region freezes the tenant's siblings: only the tenant's own processes ask.
            raise ProtocolError(f"process {peer.pid} is not one of tenant {t.id}'s")
        loop = asyncio.get_running_loop()
        t_request = time.monotonic()
        mine: Region | None = None  # the region this connection is a holder of
        # Its GPUs in index order: every command takes them in the same order, so no two wait
        # for each other (a request waits only for GPUs above those it holds).
        for g in [self.gpus[i] for i in t.gpus]:
            req = RegionRequest(
                tenant=t, writer=writer, t_request=t_request, granted=loop.create_future()
            )
            g.requests.append(req)
            self._schedule(g)
            try:
                await self._until(req.granted, reader)
                region = req.granted.result()  # ConnectionError when taking this GPU failed
            except BaseException:
                if req in g.requests:
                    g.requests.remove(req)
                elif not req.granted.done():
                    req.granted.cancel()  # being set up: _open_region lets it go again
                elif mine is None and not req.granted.cancelled():
                    mine = req.granted.result() if req.granted.exception() is None else None
                if mine is not None:
                    self._drop_holder(mine, why="owner gone")
                raise
            mine = mine or region  # the first GPU's grant made us one of its holders
        if mine is None or mine.ended:
            raise ProtocolError("the region ended before it was granted")
        await self._send(writer, {"ok": True, **self._grant_record(mine, t_request)})
        end = await self._read(reader)
        if end is None or end.get("op") != "region_end":
            # EOF (the owner died, or closed without region_end): the region ends at once.
            self._drop_holder(mine, why="owner gone")
            if end is not None:
                raise ProtocolError("expected region_end")
            return
        record = self._drop_holder(mine, why="region_end")
        await self._send(writer, {"ok": True, "region": record})

    def _schedule(self, g: Gpu) -> None:
        if g.busy or not g.requests:
            return
        r = g.region
        if r is not None:
            # Other threads of the owner nest into its region at once (counted once, on its
            # first GPU: a thread asks for each of the owner's GPUs in turn).
            for req in [x for x in g.requests if x.tenant is r.tenant]:
                g.requests.remove(req)
                if g.index == r.tenant.gpus[0]:
                    r.holders += 1
                req.granted.set_result(r)
            return
        req = g.requests.popleft()
        g.busy = True
        asyncio.get_running_loop().create_task(self._open_region(g, req))

    def _grant_record(self, r: Region, t_request: float) -> dict[str, Any]:
        return {
            "epoch": r.epochs.get(r.tenant.gpus[0], 0),
            "wait_s": time.monotonic() - t_request,
            "drain_s": r.drain_s,
            "freeze_s": r.freeze_s,
            "clean": r.clean,
            **({"gpus": list(r.gpus)} if len(r.tenant.gpus) > 1 else {}),
        }

    def _still_frozen(self) -> set[int]:
        """Tenants listed frozen by a live region. Such a region closed its gate to them and
        drained them (every context they use) before it listed them, and they cannot submit
        again until it ends: there is nothing of theirs to quiesce or drain."""
        return {
            s.id
            for g in self.gpus
            for r in (g.region, g.pending)
            if r is not None and not r.ended
            for s in r.frozen
        }

    def _drain_segments(self) -> list[Segment]:
        """The slot segments a region's quiesce and drain wait on: all but those of frozen
        tenants (a command of several GPUs that a region on another of its GPUs froze: its
        drain thread is frozen too and would time the drain out)."""
        skip = self._still_frozen()
        for w in self.workers.values():
            owner = w.tenant or self.gpus[w.gpu].pool_tenant
            if owner is not None and owner.id in skip:
                skip.add(w.slots_id)
        segs = [seg for tid, seg in self.slot_segs.items() if tid not in skip]
        return [self.seg, *segs, *self.orphan_segs]

    async def _open_region(self, g: Gpu, req: RegionRequest) -> None:
        """Steps 1-5 of design.md for req's tenant on GPU g (one GPU of its region)."""
        loop = asyncio.get_running_loop()
        t = req.tenant
        r = t.region
        if r is None or r.ended:
            if g.index != t.gpus[0]:
                # Its region ended (revoked, or its holders left) while this request waited.
                g.busy = False
                if not req.granted.done():
                    req.granted.set_exception(ConnectionError("the region ended while waiting"))
                self._schedule(g)
                return
            r = t.region = Region(tenant=t, t_request=req.t_request)
        # The region is g.pending from the start: a tenant that joins while it is set up is
        # frozen into it by _started, never left running beside it.
        g.pending = r
        siblings: list[Tenant] = []
        try:
            hold = Hold(gpu=g.index, owner=t.id)
            hold.epoch = self.seg.gate_close(
                g.index, t.id, deadline_s=t.region_timeout_s + GATE_GRACE_S
            )
            r.draining = True
            try:
                await loop.run_in_executor(
                    None,
                    functools.partial(
                        quiesce_and_drain,
                        self._drain_segments(),
                        hold,
                        quiesce_timeout_s=self.cfg.quiesce_timeout_s,
                        drain_timeout_s=self.cfg.drain_timeout_s,
                    ),
                )
            finally:
                r.draining = False
            r.problems += hold.problems
            t1 = time.monotonic()
            siblings = [s for s in g.tenants if s is not t and s not in r.frozen]
            pool = g.pool_tenant
            if pool is not None and pool not in r.frozen and pool.group.pids():
                siblings.append(pool)  # idle workers: no thread runs in a region
            # Those that joined while their siblings drained: listed already, frozen now.
            siblings += [s for s in r.deferred if s not in siblings and not s.gone]
            r.deferred.clear()
            # Listed before they are frozen, so that whatever ends the region thaws them.
            r.frozen += [s for s in siblings if s not in r.frozen]
            # Freeze the siblings in parallel (each waits for its own group to report frozen).
            frozen = await asyncio.gather(
                *(loop.run_in_executor(None, self._freeze, s) for s in siblings)
            )
            r.problems += [
                f"tenant {s.id} did not freeze"
                for s, ok in zip(siblings, frozen, strict=True)
                if not ok
            ]
            if self.cfg.sim:
                r.problems += await loop.run_in_executor(None, self._unlock_sim, list(r.frozen))
            t2 = time.monotonic()
            r.gpus.append(g.index)
            r.epochs[g.index] = hold.epoch
            await loop.run_in_executor(None, t.group.pin, self._cores(t))
            foreign = await loop.run_in_executor(None, self._foreign, g)
            if foreign:
                # Not gated, not drained, not frozen: the region cannot vouch for the GPU.
                r.problems.append(
                    f"foreign GPU process(es) {sorted(foreign)} present on GPU {g.index}"
                )
        except Exception as e:
            log.exception("opening a region for tenant %d on GPU %d failed", t.id, g.index)
            self._let_go(g, r, siblings)
            if not r.gpus:
                r.ended = True  # nothing held: the region never was
                if t.region is r:
                    t.region = None
            if not req.granted.done():
                req.granted.set_exception(ConnectionError(str(e)))
            self._schedule(g)
            return
        r.drain_s += hold.quiesce_s + hold.drain_s
        r.freeze_s += t2 - t1
        r.clocks[g.index] = self.nvml.sample(g.index) if self.nvml else None
        g.pending = None
        g.busy = False
        if r.ended:
            # Its holders left (or it was revoked) while this GPU was being taken.
            self._let_go(g, r, siblings)
            if not req.granted.done():
                req.granted.set_exception(ConnectionError("the region ended while it was taken"))
            self._schedule(g)
            return
        g.region = r
        if req.granted.cancelled() or t.gone:
            if g.index == t.gpus[0]:
                self._drop_holder(r, why="owner gone before its grant")
            self._schedule(g)
            return
        if len(r.gpus) == len(t.gpus):
            now = time.monotonic()
            r.t_grant = now
            r.wait_s = now - r.t_request
            r.clean = r.clean and not r.problems
            r.timer = loop.call_later(t.region_timeout_s, self._revoke, r)
            if r.problems:
                log.warning(
                    "region of tenant %d on GPU %s is unclean: %s",
                    t.id,
                    ",".join(map(str, r.gpus)),
                    "; ".join(r.problems),
                )
        req.granted.set_result(r)
        self._schedule(g)  # other threads of the owner waiting behind it

    def _let_go(self, g: Gpu, r: Region, siblings: list[Tenant]) -> None:
        """Undo taking GPU g for region r: its siblings, its place in r, its gate."""
        if g.pending is r:
            g.pending = None
        if g.region is r:
            g.region = None
        g.busy = False
        for s in siblings:
            if s in r.frozen:
                r.frozen.remove(s)
            self._thaw(s)
        if g.index in r.gpus:
            r.gpus.remove(g.index)
        if not r.tenant.gone:
            with contextlib.suppress(TenantsError):
                r.tenant.group.pin(self._cores(r.tenant))
        self.seg.gate_open(g.index)

    def _unlock_sim(self, siblings: list[Tenant]) -> list[str]:
        """On a simulated node, never leave a sibling frozen inside the simulated driver's
        shared lock (krexsim.h): thaw it a moment and freeze it again."""
        for _ in range(200):
            holders = _sim_lock_holders(self.seg.name + "-sim")
            stuck = [s for s in siblings if holders & set(s.group.pids())]
            if not stuck:
                return []
            for s in stuck:
                s.group.thaw()
            time.sleep(0.0005)
            for s in stuck:
                self._freeze(s)
        return ["a frozen tenant kept the simulated driver's lock"]

    def _freeze(self, t: Tenant) -> bool:
        try:
            return t.group.freeze(self.cfg.freeze_timeout_s)
        except TenantsError as e:  # e.g. it left while the region was being set up
            log.warning("freezing tenant %d failed: %s", t.id, e)
            return t.gone

    def _thaw(self, t: Tenant) -> None:
        """Thaw t unless a live region still lists it frozen (it may be a sibling on two GPUs,
        frozen by the regions of both)."""
        if t.id in self._still_frozen():
            return
        with contextlib.suppress(TenantsError):
            t.group.thaw()

    def _revoke(self, r: Region) -> None:
        if not r.ended:
            log.warning(
                "region of tenant %d on GPU %s passed its time-out (%.1f s): revoked",
                r.tenant.id,
                ",".join(map(str, r.gpus)),
                r.tenant.region_timeout_s,
            )
            self._finish_region(r, revoked=True, why="time-out")

    def _drop_holder(self, r: Region, why: str) -> dict[str, Any]:
        """One holder of region r is done; the region ends with its last holder."""
        if r.ended:
            # Already finished (revoked, or the tenant left): report what it was.
            return r.record or {"revoked": True}
        r.holders -= 1
        if r.holders > 0:
            return self._record(r, time.monotonic())
        return self._finish_region(r, revoked=False, why=why)

    def _record(self, r: Region, t_end: float) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "wait_s": r.wait_s,
            "drain_s": r.drain_s,
            "freeze_s": r.freeze_s,
            "duration_s": t_end - r.t_grant if r.granted else 0.0,
            "clean": r.clean and not r.problems,
            "revoked": r.revoked,
            "problems": list(r.problems),
        }
        if len(r.tenant.gpus) > 1:
            rec["gpus"] = list(r.gpus)
        first = r.tenant.gpus[0]
        start = r.clocks.get(first)
        end = self.nvml.sample(first) if self.nvml and start else None
        if start and end:
            # measurement.md: record the SM clock and throttle reasons; flag throttled regions.
            reasons = start["throttle_reasons"] | end["throttle_reasons"]
            for i in r.gpus[1:]:
                other = r.clocks.get(i)
                later = self.nvml.sample(i) if self.nvml and other else None
                if other and later:
                    reasons |= other["throttle_reasons"] | later["throttle_reasons"]
            rec["sm_clock_mhz"] = [start["sm_clock_mhz"], end["sm_clock_mhz"]]
            rec["throttle_reasons"] = reasons
            rec["throttled"] = throttled(reasons)
        return rec

    def _finish_region(self, r: Region, *, revoked: bool, why: str) -> dict[str, Any]:
        """Exit, on every GPU the region holds: undo the pin, thaw the siblings, open the
        gates, wake the next requests."""
        if r.ended:
            return r.record or {"revoked": True}
        r.ended = True
        t = r.tenant
        t_end = time.monotonic()
        if r.timer is not None:
            r.timer.cancel()
        r.revoked = r.revoked or revoked
        held = [self.gpus[i] for i in r.gpus]
        for g in held:
            if g.region is r:
                g.region = None
        if t.region is r:
            t.region = None
        if not t.gone:
            with contextlib.suppress(TenantsError):
                t.group.pin(self._cores(t))
        for s in r.frozen:
            self._thaw(s)
        for g in reversed(held):
            self.seg.gate_open(g.index)
        record = self._record(r, t_end)
        r.record = record
        t.regions.append(record)
        self.metrics.region(t.gpu, record)
        log.info(
            "region of tenant %d on GPU %s ended (%s) after %.3f s",
            t.id,
            ",".join(map(str, r.gpus)),
            why,
            record["duration_s"],
        )
        for g in held:
            self._schedule(g)
        return record

    # The pool (design.md, docs/pool.md).
    def _pool_size(self) -> int:
        """Warm workers per GPU. None on AMD GPUs: a worker's warm-up is CUDA's (docs/hip.md)."""
        return 0 if self.vendor == "amd" else self.cfg.workers_per_gpu()

    def _start_pools(self) -> None:
        n = self._pool_size()
        if n == 0:
            if self.vendor == "amd" and self.cfg.workers_per_gpu():
                log.info("pool: no warm workers on AMD GPUs (not built for HIP)")
            return
        for g in self.gpus:
            tid = self.next_tenant
            self.next_tenant += 1
            try:
                group = TenantGroup.create(self.freezer, self.root, tid)
            except TenantsError as e:
                log.error("no pool on GPU %d: cannot create its group: %s", g.index, e)
                continue
            g.pool_tenant = Tenant(
                id=tid,
                gpu=g.index,
                argv=["<pool>"],
                group=group,
                region_timeout_s=self.cfg.region_timeout_s,
                t_admit=time.monotonic(),
            )
            for _ in range(n):
                asyncio.get_running_loop().create_task(self._spawn_worker(g))
        log.info("pool: %d warm worker(s) per GPU, pre-importing %s", n, self.preload or "nothing")

    async def _spawn_worker(self, g: Gpu) -> None:
        assert g.pool_tenant is not None
        if self._stopping is not None and self._stopping.is_set():
            return
        wid = self.next_worker
        self.next_worker += 1
        secret = secrets.token_hex(16)
        env = dict(os.environ)
        extra = self._env(g.pool_tenant, None)
        for key in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
            if key in extra and env.get(key):
                extra[key] = f"{extra[key]}:{env[key]}"
        env.update(extra)
        env["KREX_WORKER_SECRET"] = secret
        # A slot segment per worker, so that the commands it runs, like any tenant's, write
        # only their own state.
        slots_id = self.next_tenant
        self.next_tenant += 1
        try:
            self._new_slot_segment(slots_id, 16)
        except (SegmentError, KrexError) as e:
            log.error("cannot start a pool worker on GPU %d: %s", g.index, e)
            return
        env["KREX_SLOTS"] = self._slots_name(slots_id)
        listen = self.socket.parent / f"{self.socket.name}.w{wid}"
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "krex.worker",
                "--socket",
                str(self.socket),
                "--listen",
                str(listen),
                "--worker",
                str(wid),
                "--preload",
                ",".join(self.preload),
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the daemon's terminal's Ctrl-C is not for workers
            )
        except OSError as e:
            log.error("cannot start a pool worker on GPU %d: %s", g.index, e)
            self.orphan_segs.append(self.slot_segs.pop(slots_id))
            return
        w = Worker(
            id=wid,
            gpu=g.index,
            proc=proc,
            listen=listen,
            secret=secret,
            t_start=time.monotonic(),
            slots_id=slots_id,
        )
        w.exited = asyncio.get_running_loop().create_future()
        self.workers[wid] = w
        g.pool.append(w)
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, g.pool_tenant.group.add, proc.pid)
            await loop.run_in_executor(None, g.pool_tenant.group.pin, set(g.slice.shared_cores))
        except TenantsError as e:
            log.warning("pool worker %d: %s", wid, e)
        rc = await proc.wait()
        self._worker_gone(g, w, rc)

    async def _worker_conn(
        self,
        msg: dict[str, Any],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Peer,
    ) -> None:
        wid = msg.get("worker")
        w = self.workers.get(wid) if _json_int(wid) else None
        secret = msg.get("secret")
        if (
            w is None
            or not isinstance(secret, str)
            or not secrets.compare_digest(secret.encode(), w.secret.encode())
            or peer.pid != w.proc.pid
            or w.writer is not None
        ):
            raise ProtocolError("unknown worker")
        g = self.gpus[w.gpu]
        own = self.slot_segs.get(w.slots_id)
        slots = [s for s in own.slots_of(w.proc.pid) if s.alive] if own is not None else []
        if not slots or g.pool_tenant is None:
            log.error("pool worker %d has no slot in the segment: stopping it", w.id)
            _signal_worker(w, signal.SIGKILL)
            return
        w.slot, w.writer, w.state = slots[0].index, writer, "idle"
        g.pool_failures = 0
        log.info(
            "pool worker %d ready on GPU %d after %.1f s",
            w.id,
            g.index,
            time.monotonic() - w.t_start,
        )
        while True:
            done = await self._read(reader)
            if done is None:
                break
            if done.get("op") == "done":
                self._worker_done(w, done.get("retire"))
        w.writer = None
        if w.state != "gone":
            _signal_worker(w, signal.SIGKILL)

    async def _lease(self, t: Tenant) -> dict[str, Any]:
        """An idle worker for tenant t's command, or why there is none."""
        g = self.gpus[t.gpu]
        w = next((w for w in g.pool if w.state == "idle" and w.writer is not None), None)
        if w is None or t.worker is not None:
            counts = {s: sum(x.state == s for x in g.pool) for s in ("starting", "busy")}
            return {
                "cold": f"no warm worker free on GPU {g.index} "
                f"({counts['starting']} starting, {counts['busy']} busy)"
            }
        assert w.writer is not None and g.pool_tenant is not None
        w.state, w.tenant, t.worker = "busy", t, w
        token = secrets.token_hex(16)
        try:
            g.pool_tenant.group.remove(w.proc.pid)  # it is the tenant's now, not the pool's
            await self._started(t, w.proc.pid)
            self.slot_segs[w.slots_id].set_slot_tenant(w.slot, w.proc.pid, t.id)
            w.writer.write(json.dumps({"op": "job", "token": token}).encode() + b"\n")
            await w.writer.drain()
        except (ProtocolError, KrexError, ConnectionError) as e:
            log.warning("pool worker %d could not take tenant %d: %s", w.id, t.id, e)
            self._return_to_pool(w)
            w.state = "retiring"
            _signal_worker(w, signal.SIGKILL)
            t.worker = None
            return {"cold": f"the warm worker failed: {e}"}
        g.warm_runs += 1
        self.metrics.started(g.index, warm=True)
        return {"socket": str(w.listen), "token": token, "worker": w.id}

    def _return_to_pool(self, w: Worker) -> None:
        """Worker w leaves its tenant: back into the pool's group, slot and cores."""
        g = self.gpus[w.gpu]
        t, w.tenant = w.tenant, None
        if t is not None and w.proc.pid in t.pids:
            t.pids.remove(w.proc.pid)
        if t is not None:
            with contextlib.suppress(TenantsError):
                t.group.remove(w.proc.pid)
        if g.pool_tenant is None or w.state == "gone":
            return
        with contextlib.suppress(TenantsError):
            g.pool_tenant.group.add(w.proc.pid)
            g.pool_tenant.group.pin(set(g.slice.shared_cores))
        with contextlib.suppress(KrexError, KeyError):
            self.slot_segs[w.slots_id].set_slot_tenant(w.slot, w.proc.pid, g.pool_tenant.id)
        region = g.region or g.pending
        if region is not None and g.pool_tenant not in region.frozen:
            # The pool was empty when the region began (or its siblings are still draining);
            # it holds a worker now.
            region.frozen.append(g.pool_tenant)
            if region.draining:
                region.deferred.append(g.pool_tenant)
            else:
                self._freeze(g.pool_tenant)

    def _worker_done(self, w: Worker, retire: object) -> None:
        self._return_to_pool(w)
        w.uses += 1
        if retire or w.uses >= self.cfg.pool_max_uses:
            why = retire or f"{w.uses} uses"
            log.info("pool worker %d retires: %s", w.id, why)
            w.state = "retiring"
            if w.writer is not None:
                w.writer.write(b'{"op": "exit"}\n')
        elif w.state == "busy":
            w.state = "idle"

    def _worker_gone(self, g: Gpu, w: Worker, rc: int) -> None:
        was = w.state
        if w.tenant is not None:
            self._return_to_pool(w)
        w.state = "gone"
        if w.exited is not None and not w.exited.done():
            w.exited.set_result(rc)
        if w in g.pool:
            g.pool.remove(w)
        self.workers.pop(w.id, None)
        seg = self.slot_segs.pop(w.slots_id, None)
        if seg is not None:
            self.orphan_segs.append(seg)  # goes once no process of it is left
        with contextlib.suppress(FileNotFoundError):
            w.listen.unlink()
        if was == "starting":
            g.pool_failures += 1
            log.warning(
                "pool worker %d on GPU %d died before it was ready (status %d)", w.id, g.index, rc
            )
        elif was != "retiring":
            log.warning("pool worker %d on GPU %d ended (status %d)", w.id, g.index, rc)
        if self._stopping is not None and self._stopping.is_set():
            return
        # Replace it; after 3 start-up failures in a row, only every 30 s.
        delay = 30.0 if g.pool_failures >= 3 else 0.0
        loop = asyncio.get_running_loop()
        loop.call_later(delay, lambda: loop.create_task(self._spawn_worker(g)))

    async def _worker_status(self, w: Worker) -> int:
        """The exit status of a worker whose command's client saw it vanish."""
        assert w.exited is not None
        try:
            return await asyncio.wait_for(asyncio.shield(w.exited), 10.0)
        except asyncio.TimeoutError:
            _signal_worker(w, signal.SIGKILL)
            return await w.exited

    async def _stop_pools(self) -> None:
        for w in list(self.workers.values()):
            _signal_worker(w, signal.SIGTERM)
        for w in list(self.workers.values()):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(w.proc.wait(), 10.0)
        for g in self.gpus:
            if g.pool_tenant is not None:
                with contextlib.suppress(TenantsError):
                    g.pool_tenant.group.destroy()

    def _foreign(self, g: Gpu) -> set[int]:
        """Processes using GPU g that krex does not manage (seen through NVML, or through the
        simulated node); only those visible in our pid namespace."""
        if self.cfg.sim:
            users = _sim_users(self.seg.name + "-sim", g.index)
        else:
            users = self.nvml.processes(g.index) if self.nvml is not None else None
        if not users:
            return set()
        ours = {os.getpid(), *(w.proc.pid for w in g.pool)}
        for t in [*g.tenants, *([g.pool_tenant] if g.pool_tenant else [])]:
            with contextlib.suppress(TenantsError):
                ours.update(t.group.pids())
        return {p for p in users - ours if _running(p)}

    def _segment_linked(self) -> bool:
        return self.seg_inode is not None and _inode(self.seg.name) == self.seg_inode

    # Status.
    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "socket": str(self.socket),
            "segment": self.seg.name,
            "segment_linked": self._segment_linked(),
            "slot_segments": len(self.slot_segs) + len(self.orphan_segs),
            "sim": self.cfg.sim,
            "vendor": self.vendor,
            "freezer": self.freezer.value,
            "mps": self.mps_dir is not None,
            "gpus": [
                {
                    "gpu": g.index,
                    "slots": g.slots,
                    "used": len(g.tenants),
                    "queue": len(g.admission),
                    "region_queue": len(g.requests),
                    "setting_up": g.pending.tenant.id if g.pending is not None else None,
                    "foreign": sorted(self._foreign(g)),
                    "recent": self.metrics.recent[g.index].summary(),
                    "pool": {
                        "target": self._pool_size() if g.pool_tenant else 0,
                        "workers": len(g.pool),
                        **{
                            state: sum(w.state == state for w in g.pool)
                            for state in ("starting", "idle", "busy")
                        },
                        "warm_runs": g.warm_runs,
                        "cold_runs": g.cold_runs,
                        "preload": self.preload,
                    },
                    "region_cores": sorted(g.slice.region_cores),
                    "shared_cores": sorted(g.slice.shared_cores),
                    "region": None
                    if g.region is None or not g.region.granted
                    else {
                        "tenant": g.region.tenant.id,
                        "gpus": list(g.region.gpus),
                        "age_s": now - g.region.t_grant,
                        "clean": g.region.clean,
                    },
                    "tenants": [
                        {
                            "tenant": t.id,
                            "gpus": t.gpus,
                            "argv": t.argv[:8],
                            "pids": t.pids,
                            "age_s": now - t.t_admit,
                            "regions": len(t.regions),
                        }
                        for t in g.tenants
                    ],
                }
                for g in self.gpus
            ],
        }


@dataclass(frozen=True)
class Peer:
    """Who is on the other end of a connection (SO_PEERCRED, at connect time)."""

    pid: int
    uid: int
    gid: int


_SIM_LIB: Any = None


def _json_int(value: object) -> TypeGuard[int]:
    """Whether a decoded JSON value is an integer (JSON's true and false decode to bool, an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _sim_users(sim_shm: str, gpu: int) -> set[int] | None:
    """Processes holding streams on a simulated GPU (krexsim_users in the simulated driver)."""
    global _SIM_LIB
    try:
        if _SIM_LIB is None:
            _SIM_LIB = ctypes.CDLL(str(sim_library_dir() / "libcuda.so.1"))
            _SIM_LIB.krexsim_users.argtypes = [
                ctypes.c_char_p,
                ctypes.c_uint,
                ctypes.POINTER(ctypes.c_int),
                ctypes.c_int,
            ]
        pids = (ctypes.c_int * 256)()
        n = int(_SIM_LIB.krexsim_users(sim_shm.encode(), gpu, pids, 256))
    except OSError:
        return None
    return set(pids[:n]) if n >= 0 else None


def _running(pid: int) -> bool:
    """Whether process pid exists in our namespace and is not a zombie (a zombie has no GPU
    context any more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X", "x")


def _inode(shm_name: str) -> int | None:
    """The inode behind a POSIX shared-memory name (None when the name is gone)."""
    try:
        return os.stat(Path("/dev/shm", shm_name.lstrip("/"))).st_ino
    except OSError:
        return None


def _peer(writer: asyncio.StreamWriter) -> Peer:
    sock = writer.get_extra_info("socket")
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return Peer(*struct.unpack("3i", creds))


def _parent(pid: int) -> int | None:
    """The parent of process pid (None if it does not exist)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _signal_worker(w: Worker, sig: int) -> None:
    """Signal a worker without asyncio's Process.kill(), whose poll() would reap it under
    asyncio's child watcher (which then reports status 255 instead of the real one)."""
    if w.state != "gone":
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.proc.pid, sig)


def _tgid(tid: int) -> int | None:
    try:
        for line in Path(f"/proc/{tid}/status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


# shim/sim/krexsim.h: where the simulated node publishes who holds its two locks.
_SIM_HOLDERS = (32, 36)
_SIM_LOCKS = (40, 80)


def _sim_lock_holders(sim_shm: str) -> set[int]:
    """Pids holding the simulated driver's shared locks (empty when none, or no segment)."""
    try:
        with open(Path("/dev/shm", sim_shm.lstrip("/")), "rb") as f:
            head = f.read(128)
    except OSError:
        return set()
    if len(head) < 128:
        return set()
    pids = {int.from_bytes(head[o : o + 4], "little") for o in _SIM_HOLDERS}
    for o in _SIM_LOCKS:
        tid = int.from_bytes(head[o : o + 4], "little") & 0x3FFFFFFF  # robust mutex: owner tid
        if tid and (pid := _tgid(tid)) is not None:
            pids.add(pid)
    pids.discard(0)
    return pids


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        Path("/dev/shm", name.lstrip("/")).unlink()


class _JsonLines(logging.Formatter):
    """One JSON object per log record (`daemon.log_format = "json"`)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def run(cfg: Config) -> int:
    """Run the daemon in the foreground; returns the exit status."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonLines()
        if cfg.log_format == "json"
        else logging.Formatter("%(asctime)s krex-daemon %(levelname)s %(message)s")
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        daemon = Daemon(cfg)
        asyncio.run(daemon.serve())
    except ConfigError as e:
        log.error("%s", e)
        return 2
    return 0

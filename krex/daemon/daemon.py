"""`krex daemon`: the per-node controller, as wiring: connections, admission, tenants, status.

One asyncio loop owns all state. The region protocol is krex/daemon/regions.py (the only writer
of region state, over krex/daemon/machinery.py), the warm pool krex/daemon/workers.py, the
shared segments krex/daemon/segments.py; the wire protocol is docs/protocol.md
(krex/core/wire.py), the architecture docs/architecture.md. Per GPU there is a FIFO admission
queue for slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from krex.core import liveness, messages, wire
from krex.core.build import identity, mismatch
from krex.core.config import (
    Config,
    ConfigError,
    sim_mem_bytes,
)
from krex.core.errors import KrexError, ProtocolError
from krex.core.nvml import Nvml
from krex.core.paths import (
    hip_audit_library,
    hip_shim_library,
    shim_library,
    sim_hip_available,
    sim_library_dir,
)
from krex.core.procs import parent
from krex.core.shm import MEM_KINDS, SegmentError, SlotView
from krex.core.tenants import FreezerKind, TenantGroup, TenantsError, detect_freezer, prune
from krex.core.trust import TrustError, bind_private, open_beside
from krex.core.version import __version__
from krex.daemon.admission import Admission, admit_request
from krex.daemon.conn import Conn, peer_of
from krex.daemon.machinery import NodeMachinery
from krex.daemon.memory import GIB, Memory
from krex.daemon.metrics import Metrics, MetricsError
from krex.daemon.model import AdmitRequest, Gpu, Region, Tenant
from krex.daemon.mps import Mps
from krex.daemon.node import node_plan, resolve_vendor
from krex.daemon.regions import Regions
from krex.daemon.segments import Segments
from krex.daemon.tasks import Supervisor
from krex.daemon.workers import EXIT_WAIT_S, Pool
from krex.pool.plan import preinit, startup_locale
from krex.sim.simnode import remove as remove_sim_segment
from krex.sim.simnode import segment_name as sim_segment

log = logging.getLogger("krex.daemon")
refuse = logging.getLogger("krex.daemon.connections")  # refusals: rate-limited (LogLimit)

_TENANT_SLOTS = 64  # process slots in a tenant's own segment
SIM_MEM = 143771 << 20  # the simulated GPU's default memory (shim/sim/sim.h: an H200's)
_MEMORY_TICK_S = (0.02, 0.2)  # how often the memory arbiter looks: someone waits, nobody does
STEP_MARGIN_S = 20.0  # step_s(): beyond the daemon's own bounds, for a loaded machine
_PRUNE_EVERY = 10  # reaper passes (seconds) between prunes of groups left by a predecessor
# Connections (docs/security.md, "Who may talk to the daemon"): at most MAX_CONNECTIONS open
# (fewer where the descriptor limit, raised to its hard limit, leaves less than FD_RESERVE for
# the daemon's own files), a further one refused with one error line; of them at most
# MAX_WAITING that have not sent their first request, the one waiting longest closed (with a
# line saying why) to make room; a first request within FIRST_REQUEST_S; at most BIG_REQUESTS
# first requests longer than a line (an admit's long argv) read at once; a reply written
# within SEND_S.
MAX_CONNECTIONS = 4096
FD_RESERVE = 256
MAX_WAITING = 64
FIRST_REQUEST_S = 10.0
# How long a refused connection's unread request is still taken in (see _linger).
LINGER_S = 1.0
BIG_REQUESTS = 4
BACKLOG = 1024  # connections the kernel holds for accept (a client tries again while full)


Handler = Callable[[dict[str, Any], Conn], Awaitable[None]]


class Daemon:
    """The controller of one node (or of one simulated node)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.socket = cfg.socket_path()
        self.root = cfg.segment_name().lstrip("/")
        # First of all: a second daemon on this socket must not touch the segment or the
        # cgroups of the running one (recovery reopens gates and thaws groups).
        self._lock_fd: int | None = _take_lock(self.socket)
        try:
            self._setup(cfg)
        except BaseException:
            # A start refused (a metrics port in use, a segment another daemon holds, a bad
            # setting): nothing of ours stays; what a dead predecessor left stays for the next.
            segments: Segments | None = getattr(self, "segments", None)
            if segments is not None:
                segments.abandon()
            self._drop_alive()
            self.release_lock()
            raise

    def _setup(self, cfg: Config) -> None:
        self.build = identity()  # what it started as (a rebuilt checkout is another build)
        _reclaim_files(self.socket)
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
        self.segments = Segments(cfg.segment_name(), n, cfg.slots, self.root)
        # Held until we end (or die): blocked tenants and watching clients tell a dead daemon
        # by it (krex/core/liveness.py). Before any gate of ours closes.
        self._alive_fd: int | None = liveness.hold(self.segments.gates)
        self.nvml = None if cfg.sim or self.vendor == "amd" else Nvml.open()
        self.metrics = Metrics(n)
        self.machinery = NodeMachinery(cfg, self.gpus, self.segments, self.nvml)
        self.regions = Regions(
            self.gpus,
            self.machinery,
            on_record=lambda t, rec: self.metrics.region(t.gpu, rec),
        )
        # Top-level names only: finding a submodule's spec would import its package here.
        self.preload = [
            m for m in cfg.preload() if importlib.util.find_spec(m.split(".")[0]) is not None
        ]
        self.pool = Pool(self)
        capacity = min(map(self._capacity, range(n)), default=0)
        if cfg.memory_room_gib is not None and 0 < capacity < cfg.room_bytes(capacity):
            # A room no GPU can free: every region beside siblings would wait room_wait_s.
            raise ConfigError(
                f"{cfg.source}: memory.room_gib = {cfg.memory_room_gib:g} is more than the "
                f"GPU's memory ({capacity / (1 << 30):.1f} GiB)"
            )
        self.memory = Memory(
            self.gpus,
            self.segments.live_slots,
            [self._capacity(i) for i in range(n)],
            headroom=cfg.headroom_bytes(),
            deadlock_s=cfg.memory_deadlock_s,
            learned=self.socket.parent / f"{self.socket.name}.peaks.json",
            owner_of=self._region_owner,
            owner_stuck=self._owner_stuck,
            preempt=self._preempt,
            victims=self._victims,
            room=cfg.room_bytes(self._capacity(0)) if n else 0,
            room_wait_s=cfg.memory_room_wait_s,
            device_free=self._device_free,
            device_users=self.machinery.device_users,
            unknown=cfg.unknown_bytes(capacity),
        )
        self.admission = Admission(self.gpus, self.memory)
        self.machinery.room = self._make_room
        self.mps: Mps | None = None
        self._server: asyncio.AbstractServer | None = None
        self._stopping: asyncio.Event | None = None
        self.failed: str | None = None  # why a background task ended the daemon
        self.supervisor = Supervisor(self._fail)
        self._conns: dict[asyncio.Task[Any], Conn] = {}  # open connections and their handlers
        self._waiting: dict[asyncio.Task[Any], Conn] = {}  # of those, yet to send a request
        self._max_conns = _connection_cap()
        self._big: asyncio.Semaphore | None = None  # made in the loop (serve)
        self._ops: dict[str, Handler] = {
            "admit": self._op_admit,
            "region_begin": self._op_region_begin,
            "worker_ready": self.pool.serve_worker,
            "hello": self._op_hello,
            "status": self._op_status,
        }
        if cfg.metrics_port:
            try:
                self.metrics.serve(cfg.metrics_port, cfg.metrics_address)
            except MetricsError as e:
                raise ConfigError(f"{cfg.source}: metrics: {e}") from e

    def _capacity(self, gpu: int) -> int:
        """GPU memory in bytes: NVML's total; on the simulated GPU, KREX_SIM_MEM_BYTES (what
        the simulated driver reads) or its default; 0 where unknown."""
        if self.cfg.sim:
            text = os.environ.get("KREX_SIM_MEM_BYTES", "")
            return sim_mem_bytes(text) if text else SIM_MEM
        info = self.nvml.memory(gpu) if self.nvml is not None else None
        return info[0] if info else 0

    def _region_owner(self, gpu: int) -> Tenant | None:
        r = self.regions.held(gpu) or self.regions.setting_up(gpu)
        return r.tenant if r is not None else None

    def _victims(self, gpu: int) -> list[Tenant]:
        """The commands on a GPU the memory arbiter may preempt, in the order it would: the
        youngest first (it lost the least work), a command already rerun last; never one that
        has the GPU's memory to itself, nor one whose region holds the GPU."""
        owner = self._region_owner(gpu)
        ts = [
            t
            for t in self.tenants.values()
            if gpu in t.gpus and not t.gone and not t.mem_alone and t is not owner
        ]
        return sorted(ts, key=lambda t: (t.mem_rerun, -t.t_admit))

    def _preempt(self, tid: int, why: str) -> bool:
        """End command `tid` to break a memory deadlock (krex/daemon/memory.py): its processes are
        killed, its report says why, and `krex run` runs it again from the start."""
        t = self.tenants.get(tid)
        if t is None or t.gone or t.preempted:
            return False
        pids = t.group.pids()
        if not pids:
            return False
        t.preempted = why
        mine = [s for _, s in self.segments.live_slots() if s.alive and s.tenant == tid]
        held = max(sum(s.mem_bytes for s in mine), t.device_bytes or 0)
        t.preempted_need = held + max((s.mem_want for s in mine), default=0)
        log.warning(
            "tenant %d preempted (it runs again from the start): %s; killing %s",
            tid,
            why,
            pids,
        )
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return True

    def _device_free(self, gpu: int) -> int | None:
        """The driver's free bytes (NVML: contexts and library workspaces included)."""
        info = self.nvml.memory(gpu) if self.nvml is not None else None
        return info[0] - info[1] if info else None

    async def _make_room(self, gpu: int, owner: int) -> float:
        waited = await self.memory.make_room(gpu, owner)
        if waited > 0.1:
            log.info(
                "region of tenant %d on GPU %d waited %.1f s for room in device memory",
                owner,
                gpu,
                waited,
            )
        return waited

    def _owner_stuck(self, gpu: int, waited_s: float) -> None:
        r = self.regions.held(gpu)
        if r is not None and r.granted:
            self.regions.revoke(
                r, f"the owner waited {waited_s:.1f} s for device memory its frozen siblings hold"
            )

    def stopping(self) -> bool:
        return self._stopping is not None and self._stopping.is_set()

    def _fail(self, why: str) -> None:
        """A background task the daemon cannot do without keeps dying: it stops (exit 1)."""
        self.failed = self.failed or why
        if self._stopping is not None:
            self._stopping.set()

    # Start-up and shutdown.
    async def serve(self) -> None:
        """Serve until SIGTERM or SIGINT; then thaw everything, open every gate, and exit
        (also when it cannot start serving: nothing it made stays)."""
        self._stopping = asyncio.Event()
        self._big = asyncio.Semaphore(BIG_REQUESTS)
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_loop_exception)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        try:
            await self._listen()
            self.supervisor.keep("reaper", self._reap_loop)
            self.supervisor.keep("memory arbiter", self._memory_loop)
            self.pool.start()
            await self._stopping.wait()
        finally:
            self.supervisor.cancel()
            await self._shutdown()

    async def _listen(self) -> None:
        if self.cfg.mps and not self.cfg.sim:
            self.mps = Mps.start(self.socket.parent / f"mps-{self.root}")
            self.machinery.helper = self.mps.owns
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self._server = await asyncio.start_unix_server(
            self._client, sock=bind_private(self.socket), limit=wire.MAX_LINE, backlog=BACKLOG
        )
        log.info(
            "krex daemon %s on %s: %d %s%s GPU(s), %d slots each, freezer %s, segment %s",
            __version__,
            self.socket,
            len(self.gpus),
            "simulated " if self.cfg.sim else "",
            "AMD" if self.vendor == "amd" else "NVIDIA",
            self.cfg.slots,
            self.freezer.value,
            self.segments.gates.name,
        )

    async def _shutdown(self) -> None:
        log.info("stopping: ending regions, thawing tenants, opening gates")
        if self._server is not None:
            self._server.close()
        cfg = self.cfg
        # A region being set up has threads quiescing and draining on the segments' mappings:
        # it finishes first (each of its waits is bounded), then every region ends.
        bound = cfg.quiesce_timeout_s + cfg.drain_timeout_s + cfg.freeze_timeout_s + 5.0
        await self.regions.shutdown(bound)
        await self.pool.stop()
        for g in self.gpus:
            self.segments.gates.gate_open(g.index)
        for t in list(self.tenants.values()):
            t.group.destroy()
        if self.mps is not None:
            self.mps.stop()
        if self.nvml is not None:
            self.nvml.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        await self._close_connections()
        kept = self.segments.close()
        if self.cfg.sim and not remove_sim_segment(sim_segment(self.segments.gates.name)):
            kept.append(sim_segment(self.segments.gates.name))
        if kept:
            # Their names stay while processes use them (new processes of a command find its
            # segments by name): the last `krex run` to end removes them (krex/client/leftovers.py),
            # or the next daemon takes them over.
            log.info("segment(s) %s stay while processes use them", ", ".join(kept))
        self._drop_alive()
        self.release_lock()

    def _drop_alive(self) -> None:
        """Release the liveness lock (every gate of ours is open, or none ever closed)."""
        fd: int | None = getattr(self, "_alive_fd", None)
        if fd is not None:
            os.close(fd)
            self._alive_fd = None

    def release_lock(self) -> None:
        """Remove the pid file and release the lock (the daemon is ending)."""
        if self._lock_fd is not None:
            _drop_lock(self.socket, self._lock_fd)
            self._lock_fd = None

    # Connections.
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer, peer_of(writer), wire.Lines(reader, self._big))
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = conn
        try:
            if len(self._conns) > self._max_conns:
                refuse.warning(
                    "refused a connection: %d are open (at most %d)",
                    len(self._conns) - 1,
                    self._max_conns,
                )
                raise ProtocolError(
                    f"the daemon has {len(self._conns) - 1} connections open, its most: "
                    "try again once some end"
                )
            if conn.peer.uid not in (os.getuid(), 0):
                # The socket is 0600 already; this also holds if its mode is ever loosened.
                raise ProtocolError(f"user {conn.peer.uid} may not use this daemon")
            self._waiting[task] = conn
            if len(self._waiting) > MAX_WAITING:
                self._drop_oldest_waiting()
            try:
                first = await asyncio.wait_for(conn.read(wire.MAX_REQUEST), FIRST_REQUEST_S)
            except TimeoutError:
                raise ProtocolError(f"no request within {FIRST_REQUEST_S:g} s") from None
            finally:
                self._waiting.pop(task, None)
            if first is None:
                return
            op = messages.op_of(first)
            if op != messages.Admit.OP and conn.lines.last > wire.MAX_LINE:
                raise ProtocolError(f"request longer than {wire.MAX_LINE} bytes")
            handler = self._ops.get(op) if isinstance(op, str) else None
            if handler is None:
                raise ProtocolError(f"unknown op {op!r}")
            await handler(first, conn)
        except ProtocolError as e:
            with contextlib.suppress(ConnectionError):
                await conn.send({"ok": False, "error": str(e)})
                if conn.lines.last == 0:  # refused before its request was read
                    await _linger(writer, reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug, not the client's fault: log it, answer, keep serving
            log.exception("request failed")
            with contextlib.suppress(ConnectionError, OSError):
                await conn.send({"ok": False, "error": "internal error (see the log)"})
        finally:
            self._conns.pop(task, None)
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()

    def _drop_oldest_waiting(self) -> None:
        """More connections than MAX_WAITING have sent no request yet: the one that waited
        longest is told why and closed (a client sends its request as it connects)."""
        task, conn = next(iter(self._waiting.items()))
        del self._waiting[task]
        refuse.warning(
            "closed a connection (pid %d) that sent no request: %d others wait for theirs",
            conn.peer.pid,
            MAX_WAITING,
        )
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            conn.writer.write(
                wire.encode_reply(
                    {
                        "ok": False,
                        "error": f"closed: no request yet and {MAX_WAITING} newer connections "
                        "wait for theirs",
                    }
                )
            )
            conn.writer.close()

    async def _close_connections(self) -> None:
        """At shutdown: every client sees EOF and every handler ends on its own (a handler
        cancelled by asyncio.run instead is logged as an error by asyncio's streams)."""
        for conn in list(self._conns.values()):
            with contextlib.suppress(ConnectionError, OSError):
                conn.writer.close()
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=5.0)

    async def _op_hello(self, msg: dict[str, Any], conn: Conn) -> None:
        await conn.send(
            {"ok": True, "version": __version__, "pid": os.getpid(), "build": self.build}
        )

    async def _op_status(self, msg: dict[str, Any], conn: Conn) -> None:
        await conn.send({"ok": True, **self.status()})

    # Admission.
    async def _op_admit(self, msg: dict[str, Any], conn: Conn) -> None:
        theirs = messages.Admit.build_of(msg)
        if theirs is not None and (why := mismatch(theirs, self.build, self.socket)):
            raise ProtocolError(why)  # never a silent join of another build (docs/security.md)
        admit = messages.parse(msg, messages.Admit)
        req = admit_request(admit, self.cfg, self.admission.rerun_need)
        if not self.segments.linked():
            # Running tenants keep their mapping and carry on; a new one would find no segment
            # and run ungated, so none is let in.
            raise ProtocolError(
                f"the shared segment {self.segments.gates.name} was removed under the daemon: "
                "running commands finish, new ones cannot be gated; restart the daemon"
            )
        gpus = self.admission.pick(admit.gpu, admit.gpus)
        for g in gpus:
            if self.memory.too_large(req.mem, g.index):
                have = self.memory.state[g.index].capacity / GIB
                raise ProtocolError(
                    f"--mem {req.mem / GIB:.1f} GiB is more than GPU {g.index} has ({have:.1f} GiB)"
                )
        t = await self._admit(gpus, req, conn)
        try:
            reply: dict[str, Any] = {"ok": True, "tenant": t.id, "gpu": t.gpu, "gpus": t.gpus}
            reply["build"] = self.build
            reply["step_s"] = self.step_s()
            reply["env"] = self.tenant_env(t, req.auto)
            if len(gpus) == 1 and (gpus[0].pool or self.pool.size()):
                # What a client needs to decide whether its command can run warm (pool.py).
                reply["pool"] = {
                    "python": sys.executable,
                    "env": {k: v for k, v in os.environ.items() if preinit(k)},
                    "locale": startup_locale(),  # the workers start as we did
                }
            await conn.send(reply)
            await self._tenant_conn(t, conn)
        finally:
            self._release(t)

    def step_s(self) -> float:
        """The longest this daemon takes to answer `started` (placing the process, and
        freezing it into a live region: timeouts.freeze_s) or `finished` (a lost warm child's
        status: workers.EXIT_WAIT_S), with a margin for a loaded machine: what the client waits."""
        return max(self.cfg.freeze_timeout_s, EXIT_WAIT_S) + STEP_MARGIN_S

    async def _admit(self, gpus: list[Gpu], req: AdmitRequest, conn: Conn) -> Tenant:
        """A slot on each of gpus (taken in index order: a command of several GPUs never holds
        a slot while it waits for one that the holder of another slot waits for), then a
        tenant with its group and slot segment."""
        held: list[Gpu] = []
        try:
            for g in gpus:
                await self.admission.take(g, req, conn)
                held.append(g)
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
        except BaseException:
            for g in held:
                self.admission.reserve(g, req, -1)
                self.admission.admit_next(g)
            raise
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
        )
        self.tenants[tid] = t
        for x in gpus:
            self.admission.reserve(x, req, -1)
            x.tenants.append(t)
            self.metrics.admitted(x.index)
        log.info("admitted tenant %d on GPU %s: %s", tid, _names(t.gpus), " ".join(t.argv)[:200])
        return t

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

    # A tenant's conversation (started or lease, then finished).
    async def _tenant_conn(self, t: Tenant, conn: Conn) -> None:
        while (raw := await conn.read()) is not None:
            try:
                msg = messages.parse(raw, messages.Started, messages.Lease, messages.Finished)
            except messages.UnknownOp as e:
                raise ProtocolError(f"unknown op {e.op!r} for a tenant") from None
            if isinstance(msg, messages.Started):
                await self._tenant_started(t, msg, conn)
            elif isinstance(msg, messages.Lease):
                await conn.send({"ok": True, **await self.pool.lease(t, conn.peer.pid)})
            elif isinstance(msg, messages.Finished):
                await self._tenant_finished(t, msg, conn)
                return

    async def _tenant_started(self, t: Tenant, msg: messages.Started, conn: Conn) -> None:
        pid, warm = msg.pid, msg.warm
        if t.pids or not (self.pool.is_child(t, pid) if warm else parent(pid) == conn.peer.pid):
            # Only the command `krex run` itself forked (or its fork server did), once: never
            # someone else's process into a group that will be frozen.
            raise ProtocolError(f"process {pid} is not this client's command")
        await self.started(t, pid)
        if not warm:
            self.metrics.started(t.gpu, warm=False)
        await conn.send({"ok": True, "freezer": self.freezer.value})

    async def _tenant_finished(self, t: Tenant, msg: messages.Finished, conn: Conn) -> None:
        status = None
        if msg.worker_lost and t.worker is not None:
            status = await self.pool.exit_status(t.pids[0] if t.pids else None)
            t.child_lost = True
        if t.worker is None:
            self.gpus[t.gpu].cold_runs += 1
        report = self._report(t)
        await conn.send({"ok": True, "report": report, "worker_status": status})

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

    def _release(self, t: Tenant) -> None:
        if t.gone:
            return
        t.gone = True
        self.regions.tenant_left(t)
        if t.worker is not None:
            # Its child may still be tearing down: into the pool tenant before ours goes.
            self.pool.adopt(t, killed=t.child_lost)
        self._account()
        self.segments.retire(t.id)  # goes once its last process has exited
        self._account()
        t.group.destroy()
        del self.tenants[t.id]
        for i in t.gpus:
            g = self.gpus[i]
            g.tenants.remove(t)
            self.metrics.finished(i)
            self.admission.admit_next(g)
        log.info("tenant %d left GPU %s", t.id, _names(t.gpus))

    # Regions.
    async def _op_region_begin(self, msg: dict[str, Any], conn: Conn) -> None:
        begin = messages.parse(msg, messages.RegionBegin)
        t = self.tenants.get(begin.tenant)
        if t is None:
            raise ProtocolError(f"tenant {begin.tenant!r} is not admitted here")
        candidate = begin.candidate
        loop = asyncio.get_running_loop()
        if conn.peer.pid not in await loop.run_in_executor(None, t.group.pids):
            # A region freezes the tenant's siblings: only the tenant's own processes ask.
            raise ProtocolError(f"process {conn.peer.pid} is not one of tenant {t.id}'s")
        t_request = time.monotonic()
        region: Region = await self.regions.acquire(
            t, conn.until, pid=conn.peer.pid, candidate=candidate
        )
        try:
            await conn.send({"ok": True, **_grant_reply(region, t_request)})
            end = await conn.read()
        except BaseException:
            self.regions.release(region, why="owner gone")
            raise
        if end is None or messages.op_of(end) != messages.RegionEnd.OP:
            # EOF (the owner died, or closed without region_end): the region ends at once.
            self.regions.release(region, why="owner gone")
            if end is not None:
                raise ProtocolError("expected region_end")
            return
        try:
            done = messages.parse(end, messages.RegionEnd)
        except ProtocolError:
            self.regions.release(region, why="region_end")  # ended all the same: nothing held
            raise
        record = self.regions.release(region, why="region_end", calls=done.calls)
        await conn.send({"ok": True, "region": record})

    # Accounting.
    def _account(self) -> None:
        self.segments.account(self.tenants, draining=self.regions.busy())

    def _report(self, t: Tenant) -> dict[str, Any]:
        self._account()
        total = self.segments.totals(t)
        self.memory.learn(t, max(total.mem_peak, total.device_peak or 0))
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

    async def _reap_loop(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(1.0)
            LOG_LIMIT.flush()
            self._account()
            self._sample_device()
            self.machinery.tick()
            self.pool.end_leftovers()
            for g in self.gpus:
                self.metrics.levels(
                    g.index,
                    queue=len(g.admission),
                    region_queue=self.regions.queued(g.index),
                    slots=len(g.tenants),
                    idle=sum(w.state == "idle" for w in g.pool),
                )
            n += 1
            if n % _PRUNE_EVERY == 0:
                # Groups of tenants that outlived a predecessor daemon, once they are empty.
                keep = {t.id for t in self.tenants.values()}
                keep |= {g.pool_tenant.id for g in self.gpus if g.pool_tenant is not None}
                keep |= {g.zygotes.tenant for g in self.gpus if g.zygotes is not None}
                with contextlib.suppress(TenantsError):
                    prune(self.root, keep)

    def _sample_device(self) -> None:
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
            for t in g.tenants:
                n = sum(used.get(s.pid, 0) for s in live.get(t.id, []))
                t.device_bytes = n
                t.device_peak = max(t.device_peak or 0, n)
                if self.nvml is not None:
                    t.nvml_bytes = n
                    t.nvml_peak = max(t.nvml_peak or 0, n)

    async def _memory_loop(self) -> None:
        """The memory arbiter (krex/daemon/memory.py): fast while anyone waits; when a GPU's waiters
        are gone, or memory came back, its queued commands are looked at again."""
        while True:
            try:
                anyone = self.memory.tick(time.monotonic_ns())
            except Exception:  # never let the arbiter die: log it, try again next tick
                log.exception("memory arbiter")
                anyone = False
            for g in self.gpus:
                if g.admission:
                    self.admission.admit_next(g)
            await asyncio.sleep(_MEMORY_TICK_S[0] if anyone else _MEMORY_TICK_S[1])

    # Status.
    def status(self) -> dict[str, Any]:
        live = self.segments.live_by_tenant()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "socket": str(self.socket),
            "segment": self.segments.gates.name,
            "segment_linked": self.segments.linked(),
            "slot_segments": len(self.segments.tenants) + len(self.segments.orphans),
            "sim": self.cfg.sim,
            "vendor": self.vendor,
            "freezer": self.freezer.value,
            "mps": self.mps is not None,
            "gpus": [self._gpu_status(g, time.monotonic(), live) for g in self.gpus],
        }

    def _gpu_status(self, g: Gpu, now: float, live: dict[int, list[SlotView]]) -> dict[str, Any]:
        held, pending = self.regions.held(g.index), self.regions.setting_up(g.index)
        return {
            "gpu": g.index,
            "slots": g.slots,
            "used": len(g.tenants),
            "queue": len(g.admission),
            "region_queue": self.regions.queued(g.index),
            "setting_up": pending.tenant.id if pending is not None else None,
            "foreign": sorted(self.machinery.foreign(g.index)),
            "recent": self.metrics.recent[g.index].summary(),
            "pool": self.pool.status(g),
            "memory": self.memory.status(g.index),
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
                    "memory": self._tenant_memory(t, live.get(t.id, [])),
                }
                for t in g.tenants
            ],
        }

    def _tenant_memory(self, t: Tenant, live: list[SlotView]) -> dict[str, Any]:
        """What t's live processes (`live`, their slots) hold now (the shim's count and
        NVML's), its peak, and how long it has been waiting for memory (0: not waiting)."""
        since = [s.mem_since_ns for s in live if s.mem_want and s.mem_since_ns]
        return {
            "bytes": sum(s.mem_bytes for s in live),
            "peak_bytes": max([t.mem_peak, *(s.mem_peak for s in live)]),
            "waiting_s": (time.monotonic_ns() - min(since)) / 1e9 if since else 0.0,
            "nvml_bytes": t.nvml_bytes,
        }


def _connection_cap() -> int:
    """MAX_CONNECTIONS, or fewer where the descriptor limit (raised to the hard limit) does
    not leave FD_RESERVE descriptors for the daemon's own files beside them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    cap = min(MAX_CONNECTIONS, soft - FD_RESERVE)
    if cap < MAX_CONNECTIONS:
        log.info("at most %d connections (descriptor limit %d)", max(cap, 16), soft)
    return max(cap, 16)


def _loop_exception(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's own errors: out of descriptors at accept is one line (rate-limited), not a
    traceback a second; anything else as asyncio says it."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and "accept" in str(context.get("message", "")):
        refuse.error("cannot accept connections: %s (the limit is the daemon's descriptors)", exc)
        return
    loop.default_exception_handler(context)


def _take_lock(sock: Path) -> int:
    """Hold the daemon's lock beside its socket (its pid in it), or ConfigError. A daemon
    removes the file as it ends (_drop_lock), so the lock is taken on the file that is under
    the name once held: one locked after its name went is no lock."""
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = str(sock) + ".pid"
    while True:
        try:
            fd = open_beside(path, os.O_RDWR | os.O_CREAT)
        except TrustError as e:  # planted: a symlink into someone's files, or not ours
            raise ConfigError(f"the daemon's pid file {e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"another krex daemon is running on {sock}") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # its daemon removed it as we opened it: take the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _drop_lock(sock: Path, fd: int) -> None:
    """Remove the pid file (still holding its lock, so no other daemon has it), then release."""
    path = str(sock) + ".pid"
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            os.unlink(path)
    os.close(fd)


def _reclaim_files(sock: Path) -> None:
    """What a daemon that died on this socket left beside it (we hold its lock: it is dead):
    its warm workers' sockets that nobody listens on, a half-written peaks file."""
    for path in sock.parent.glob(f"{sock.name}.w*"):
        if not path.name[len(sock.name) + 2 :].isdigit() or not path.is_socket():
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        except OSError:
            pass
        finally:
            probe.close()
    with contextlib.suppress(FileNotFoundError):
        (sock.parent / f"{sock.name}.peaks.tmp").unlink()


async def _linger(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> None:
    """After refusing a connection whose request is unread: end our side and take what the
    client still sends, for at most LINGER_S, so that its send does not fail (a closed peer
    is EPIPE) before it reads the one error line."""
    with contextlib.suppress(OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
    deadline = time.monotonic() + LINGER_S
    with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError):
        while (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(reader.read(65536), left):
                return


def _grant_reply(r: Region, t_request: float) -> dict[str, Any]:
    """What a granted `region_begin` is answered with (docs/protocol.md)."""
    return {
        "epoch": r.epochs.get(r.tenant.gpus[0], 0),
        "wait_s": time.monotonic() - t_request,
        "drain_s": r.drain_s,
        "freeze_s": r.freeze_s,
        "clean": r.clean,
        **({"gpus": list(r.gpus)} if len(r.tenant.gpus) > 1 else {}),
    }


def _memory_report(t: Tenant) -> dict[str, Any]:
    """A report's `memory` (docs/memory.md): peak, waits (per kind of call), and
    out-of-memory errors the command saw, split into those it would have had alone and those
    only sharing caused; NVML's peak and the driver's (NVML's, or the simulated driver's;
    sampled once a second, so at most the real one) as the cross-check."""
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
    }


def _names(gpus: list[int]) -> str:
    return ",".join(map(str, gpus))


class LogLimit(logging.Filter):
    """At most BURST records of one kind (logger, level and message before its arguments) of
    WARNING or above in WINDOW_S seconds; the rest are counted and said in one line once the
    window is over (at the next of its kind, or the reaper's flush)."""

    BURST = 10
    WINDOW_S = 60.0

    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[tuple[str, int, str], list[float]] = {}  # start, count, not logged

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "krex_summary", False):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        kind = self.kinds.get(key)
        if kind is None or now - kind[0] >= self.WINDOW_S:
            if kind is not None and kind[2]:
                self._say(key, kind)
            self.kinds[key] = [now, 1, 0]
            return True
        kind[1] += 1
        if kind[1] <= self.BURST:
            return True
        kind[2] += 1
        return False

    def flush(self) -> None:
        """Say what windows that are over left unsaid; forget them."""
        now = time.monotonic()
        for key, kind in list(self.kinds.items()):
            if now - kind[0] >= self.WINDOW_S:
                del self.kinds[key]
                if kind[2]:
                    self._say(key, kind)

    def _say(self, key: tuple[str, int, str], kind: list[float]) -> None:
        logging.getLogger(key[0]).log(
            key[1],
            "%d more message(s) like %r in %g s, not logged",
            int(kind[2]),
            key[2][:200],
            self.WINDOW_S,
            extra={"krex_summary": True},
        )


LOG_LIMIT = LogLimit()


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
    handler.addFilter(LOG_LIMIT)
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        daemon = Daemon(cfg)
        asyncio.run(daemon.serve())
    except (ConfigError, SegmentError, TenantsError) as e:
        # What it cannot start with (a foreign or locked segment, an unsafe directory): one line.
        log.error("%s", e)
        return 2
    if daemon.failed:
        log.error("krex daemon stopped: %s", daemon.failed)
        return 1
    return 0

"""The warm pool as the daemon runs it (docs/pool.md): per GPU, fork servers (krex/pool/worker.py)
that have imported the configured modules and touched no GPU. Each forks a fresh child per
command; any number of commands run from one server at once, so a command finds no warm
worker only while every server of its GPU is starting.

The servers wait in a group of their own, pinned to the GPU's shared cores and never frozen:
they hold no context and do no GPU work. A command's child is placed in its tenant's group
when `krex run` reports its pid, like a cold command. When the command is over its processes
may still be tearing down (a framework's exit handlers, the interpreter's finalisation): they
move into the GPU's pool tenant, which regions freeze like any sibling, until they are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from krex.core import messages, wire
from krex.core.errors import KrexError, ProtocolError
from krex.core.procs import parent, start_time
from krex.core.tenants import TenantGroup, TenantsError
from krex.daemon.model import Gpu, PoolWorker, Tenant
from krex.daemon.tasks import spawn

if TYPE_CHECKING:
    from pathlib import Path

    from krex.core.config import Config
    from krex.core.tenants import FreezerKind
    from krex.daemon.conn import Conn
    from krex.daemon.metrics import Metrics
    from krex.daemon.regions import Regions
    from krex.daemon.segments import Segments

log = logging.getLogger("krex.daemon")

_RESTART_DELAY_S = 30.0  # after 3 start-up failures in a row
EXIT_WAIT_S = 10.0  # a lost warm child's status, from its server (the client waits longer)
_KEEP_EXITS = 4096  # exit statuses of children kept for their clients
TEARDOWN_S = 120.0  # what a warm command leaves running is ended after this long


class PoolHost(Protocol):
    """What the pool needs of the node it runs on (krex.daemon.node.Node is one)."""

    @property
    def cfg(self) -> Config: ...
    @property
    def socket(self) -> Path: ...
    @property
    def root(self) -> str: ...
    @property
    def freezer(self) -> FreezerKind: ...
    @property
    def vendor(self) -> str: ...
    @property
    def gpus(self) -> list[Gpu]: ...
    @property
    def segments(self) -> Segments: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def regions(self) -> Regions: ...
    @property
    def preload(self) -> list[str]: ...
    def stopping(self) -> bool: ...
    def tenant_env(self, t: Tenant, auto: str | None) -> dict[str, str]: ...


class Pool:
    """Every GPU's fork servers and the children they started."""

    def __init__(self, node: PoolHost) -> None:
        self.d = node
        self.workers: dict[int, PoolWorker] = {}
        self.next_worker = 1
        self.exits: dict[int, int] = {}  # child pid -> exit status, as the servers report them
        self.leftovers: dict[int, tuple[float | None, float]] = {}  # pid -> (start, kill at)
        self._exit_waiters: dict[int, asyncio.Future[int]] = {}
        self.stopping = False  # stop() ends the workers: their ends are expected, not warned of

    def size(self) -> int:
        """Fork servers per GPU. None on AMD GPUs: the pool is CUDA's (docs/hip.md)."""
        return 0 if self.d.vendor == "amd" else self.d.cfg.workers_per_gpu()

    def start(self) -> None:
        n = self.size()
        if n == 0:
            if self.d.vendor == "amd" and self.d.cfg.workers_per_gpu():
                log.info("pool: no warm workers on AMD GPUs (not built for HIP)")
            return
        for g in self.d.gpus:
            try:
                tid, zid = self.d.segments.take_id(), self.d.segments.take_id()
                group = TenantGroup.create(self.d.freezer, self.d.root, tid)
                g.zygotes = TenantGroup.create(self.d.freezer, self.d.root, zid)
            except TenantsError as e:
                log.error("no pool on GPU %d: cannot create its groups: %s", g.index, e)
                continue
            g.pool_tenant = Tenant(
                id=tid,
                gpu=g.index,
                argv=["<pool>"],
                group=group,
                region_timeout_s=self.d.cfg.region_timeout_s,
                region_settle_s=self.d.cfg.region_settle_s,
                region_capped_settle_s=self.d.cfg.region_capped_settle_s,
                t_admit=time.monotonic(),
            )
            for _ in range(n):
                spawn(self._spawn(g), f"pool worker on GPU {g.index}")
        log.info("pool: %d fork server(s) per GPU, pre-importing %s", n, self.d.preload or "none")

    def _worker_env(self, g: Gpu, secret: str) -> dict[str, str]:
        assert g.pool_tenant is not None
        # The shim must be preloaded into the server itself: its children cannot load it later.
        env = dict(os.environ)
        extra = self.d.tenant_env(g.pool_tenant, None)
        for key in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
            if key in extra and env.get(key):
                extra[key] = f"{extra[key]}:{env[key]}"
        env.update(extra)
        env["KREX_WORKER_SECRET"] = secret
        return env

    async def _spawn(self, g: Gpu) -> None:
        if self.d.stopping() or g.zygotes is None:
            return
        wid, secret = self.next_worker, secrets.token_hex(16)
        self.next_worker += 1
        listen = self.d.socket.parent / f"{self.d.socket.name}.w{wid}"
        argv = ["--socket", str(self.d.socket), "--listen", str(listen), "--worker", str(wid)]
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "krex.pool.worker",
                *argv,
                f"--preload={','.join(self.d.preload)}",
                env=self._worker_env(g, secret),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the daemon's terminal's Ctrl-C is not for workers
            )
        except OSError as e:
            log.error("cannot start a pool worker on GPU %d: %s", g.index, e)
            return
        w = PoolWorker(id=wid, gpu=g.index, proc=proc, listen=listen, secret=secret)
        w.t_start = time.monotonic()
        w.exited = asyncio.get_running_loop().create_future()
        self.workers[wid] = w
        g.pool.append(w)
        try:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, g.zygotes.add, proc.pid)
            await loop.run_in_executor(None, g.zygotes.pin, set(g.slice.shared_cores))
        except TenantsError as e:
            log.warning("pool worker %d: %s", wid, e)
        self._gone(g, w, await proc.wait())

    async def serve_worker(self, msg: dict[str, Any], conn: Conn) -> None:
        """A server's control connection (`worker_ready`), for as long as it lives: the exit
        status of each child it reaps."""
        ready = messages.parse(msg, messages.WorkerReady)
        w = self.workers.get(ready.worker)
        if (
            w is None
            or not secrets.compare_digest(ready.secret.encode(), w.secret.encode())
            or conn.peer.pid != w.proc.pid
            or w.writer is not None
        ):
            raise ProtocolError("unknown worker")
        g = self.d.gpus[w.gpu]
        w.writer, w.state = conn.writer, "idle"
        g.pool_failures = 0
        log.info("pool worker %d ready on GPU %d after %.1f s", w.id, g.index, w.ready_s())
        while (report := await conn.read()) is not None:
            try:
                exited = messages.parse(report, messages.Exited)
            except ProtocolError:
                continue  # not a report of a child: nothing to note
            self._exited(exited.pid, exited.status)
        w.writer = None
        if w.state != "gone":
            _signal(w, signal.SIGKILL)

    def _exited(self, pid: int, status: int) -> None:
        self.exits[pid] = status
        while len(self.exits) > _KEEP_EXITS:
            self.exits.pop(next(iter(self.exits)))
        waiter = self._exit_waiters.pop(pid, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(status)

    async def lease(self, t: Tenant, client: int) -> dict[str, Any]:
        """A server to fork tenant t's command for process `client` (its krex run), with a
        one-time token; or why there is none."""
        g = self.d.gpus[t.gpu]
        ready = [w for w in g.pool if w.state == "idle" and w.writer is not None]
        if not ready or t.worker is not None:
            starting = sum(w.state == "starting" for w in g.pool)
            return {"cold": f"no warm worker ready on GPU {g.index} ({starting} starting)"}
        w = min(ready, key=lambda x: x.leases)  # spread the forks
        token = secrets.token_hex(16)
        try:
            assert w.writer is not None
            w.writer.write(wire.encode(messages.Job(token, client).to_wire()))
            await w.writer.drain()
        except (ConnectionError, OSError) as e:
            log.warning("pool worker %d could not take tenant %d: %s", w.id, t.id, e)
            return {"cold": f"the warm worker failed: {e}"}
        w.leases += 1
        t.worker = w
        g.warm_runs += 1
        self.d.metrics.started(g.index, warm=True)
        return {"socket": str(w.listen), "token": token, "worker": w.id}

    def is_child(self, t: Tenant, pid: int) -> bool:
        """Whether pid is a child that t's server forked (the command of a warm tenant)."""
        return t.worker is not None and parent(pid) == t.worker.proc.pid

    def adopt(self, t: Tenant, killed: bool) -> None:
        """Warm tenant t is over; what of it still runs (its child tearing down: a framework's
        exit handlers, the interpreter's finalisation; processes it left) goes into the pool
        tenant, frozen in regions like a sibling and never taken for a foreign process, for at
        most TEARDOWN_S (at once when its child was `killed`, reporting nothing: its orphans have
        nobody left to shut them down), then ended."""
        g = self.d.gpus[t.gpu]
        pool = g.pool_tenant
        if pool is None:
            return
        kill_at = time.monotonic() + (0.0 if killed else TEARDOWN_S)
        with contextlib.suppress(TenantsError):
            pids = t.group.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(TenantsError):
                    t.group.remove(pid)
                    pool.group.add(pid)
                    self.leftovers[pid] = (start_time(pid), kill_at)
            pool.group.pin(set(g.slice.shared_cores))
        own = self.d.segments.tenants.get(t.id)
        for s in own.slots() if own is not None else []:
            if s.alive and s.tenant == t.id:
                with contextlib.suppress(KrexError, KeyError):
                    self.d.segments.hand_over(t.id, s.index, s.pid, t, pool.id)
        self.d.regions.tenant_joined(pool)

    def end_leftovers(self) -> None:
        """Kill what warm commands left running past its time (the daemon's tick), their
        processes started since included."""
        now = time.monotonic()
        self._adopt_late(now)
        for pid, (started, kill_at) in list(self.leftovers.items()):
            if start_time(pid) != started:
                del self.leftovers[pid]  # gone (or its pid reused)
            elif now >= kill_at:
                log.info("process %d of a warm command outlived its teardown: ended", pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                del self.leftovers[pid]

    def _adopt_late(self, now: float) -> None:
        """Processes a leftover started after its command ended (a late grandchild, even in a
        session of its own) are in the pool tenant's group but not yet among the leftovers:
        each ends when the leftover it descends from does; one whose ancestors are all gone
        ends with the last of the leftovers (no later than any command's bound), at once when
        there is none (the teardown bound of docs/pool.md; one once lived 717 s past it)."""
        for g in self.d.gpus:
            if g.pool_tenant is None:
                continue
            try:
                pids = g.pool_tenant.group.pids()
            except TenantsError:
                continue
            for pid in pids:
                if pid in self.leftovers:
                    continue
                kill_at = None
                p: int | None = pid
                for _ in range(64):  # up its ancestry, to a leftover we know
                    p = parent(p) if p else None
                    if not p:
                        break
                    if p in self.leftovers:
                        kill_at = self.leftovers[p][1]
                        break
                if kill_at is None:
                    kill_at = max((k for _, k in self.leftovers.values()), default=now)
                self.leftovers[pid] = (start_time(pid), kill_at)

    def _gone(self, g: Gpu, w: PoolWorker, rc: int) -> None:
        was = w.state
        w.state = "gone"
        if w.exited is not None and not w.exited.done():
            w.exited.set_result(rc)
        if w in g.pool:
            g.pool.remove(w)
        self.workers.pop(w.id, None)
        with contextlib.suppress(FileNotFoundError):
            w.listen.unlink()
        if self.stopping:  # ended by stop(), ready or not
            log.info("pool worker %d on GPU %d stopped (status %d)", w.id, g.index, rc)
        elif was == "starting":
            g.pool_failures += 1
            log.warning(
                "pool worker %d on GPU %d died before it was ready (status %d)", w.id, g.index, rc
            )
        else:
            log.warning("pool worker %d on GPU %d ended (status %d)", w.id, g.index, rc)
        if self.d.stopping():
            return
        delay = _RESTART_DELAY_S if g.pool_failures >= 3 else 0.0
        loop = asyncio.get_running_loop()
        loop.call_later(delay, lambda: spawn(self._spawn(g), f"pool worker on GPU {g.index}"))

    async def exit_status(self, pid: int | None) -> int | None:
        """The exit status of a warm command's child whose client saw it vanish (its server
        reaps it and says how it ended); None when it does not say in time."""
        if pid is None:
            return None
        if pid in self.exits:
            return self.exits[pid]
        fut = self._exit_waiters.setdefault(pid, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), EXIT_WAIT_S)
        except asyncio.TimeoutError:
            return None
        finally:
            self._exit_waiters.pop(pid, None)

    async def stop(self) -> None:
        self.stopping = True
        for pid, (started, _) in self.leftovers.items():
            if start_time(pid) == started:  # nobody would end them after us
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.leftovers.clear()
        for w in list(self.workers.values()):
            _signal(w, signal.SIGTERM)
        for w in list(self.workers.values()):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(w.proc.wait(), EXIT_WAIT_S)
        for g in self.d.gpus:
            for group in (g.pool_tenant.group if g.pool_tenant else None, g.zygotes):
                if group is not None:
                    with contextlib.suppress(TenantsError):
                        group.destroy()

    def status(self, g: Gpu) -> dict[str, Any]:
        rss = 0
        for w in g.pool:
            with contextlib.suppress(psutil.Error):
                rss += psutil.Process(w.proc.pid).memory_info().rss
        return {
            "target": self.size() if g.pool_tenant else 0,
            "workers": len(g.pool),
            "starting": sum(w.state == "starting" for w in g.pool),
            "idle": sum(w.state == "idle" for w in g.pool),
            # Children forked by the servers that are still running (commands, or their
            # teardown in the pool tenant).
            "busy": sum(t.worker is not None for t in g.tenants),
            "tearing_down": len(_pids(g.pool_tenant)),
            "rss_mib": round(rss / (1 << 20)),
            "warm_runs": g.warm_runs,
            "cold_runs": g.cold_runs,
            "preload": self.d.preload,
        }


def _pids(t: Tenant | None) -> list[int]:
    if t is None:
        return []
    with contextlib.suppress(TenantsError):
        return t.group.pids()
    return []


def _signal(w: PoolWorker, sig: int) -> None:
    """Signal a server without asyncio's Process.kill(), whose poll() would reap it under
    asyncio's child watcher (which then reports status 255 instead of the real one)."""
    if w.state != "gone":
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.proc.pid, sig)

"""The warm pool as the daemon runs it (docs/pool.md): per GPU, worker processes that hold a
context and have imported the configured modules; each is leased to one tenant's command at a
time, goes back to the pool's group afterwards, and is replaced when it retires or dies.

Idle workers wait in the GPU's pool tenant, a group that regions freeze like any sibling.
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
from typing import TYPE_CHECKING, Any

from krex import wire
from krex.errors import KrexError, ProtocolError
from krex.model import Gpu, PoolWorker, Tenant
from krex.shm import SegmentError
from krex.tenants import TenantGroup, TenantsError

if TYPE_CHECKING:
    from krex.daemon import Conn, Daemon

log = logging.getLogger("krex.daemon")

_WORKER_SLOTS = 16  # process slots in a worker's own segment
_RESTART_DELAY_S = 30.0  # after 3 start-up failures in a row
_EXIT_WAIT_S = 10.0


class Pool:
    """Every GPU's warm workers."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.workers: dict[int, PoolWorker] = {}
        self.next_worker = 1
        self._trimmed_ns: dict[int, int] = {}  # per GPU: when an idle worker was last trimmed

    def size(self) -> int:
        """Warm workers per GPU. None on AMD GPUs: a worker's warm-up is CUDA's (docs/hip.md)."""
        return 0 if self.d.vendor == "amd" else self.d.cfg.workers_per_gpu()

    def start(self) -> None:
        n = self.size()
        if n == 0:
            if self.d.vendor == "amd" and self.d.cfg.workers_per_gpu():
                log.info("pool: no warm workers on AMD GPUs (not built for HIP)")
            return
        for g in self.d.gpus:
            tid = self.d.segments.take_id()
            try:
                group = TenantGroup.create(self.d.freezer, self.d.root, tid)
            except TenantsError as e:
                log.error("no pool on GPU %d: cannot create its group: %s", g.index, e)
                continue
            g.pool_tenant = Tenant(
                id=tid,
                gpu=g.index,
                argv=["<pool>"],
                group=group,
                region_timeout_s=self.d.cfg.region_timeout_s,
                t_admit=time.monotonic(),
            )
            for _ in range(n):
                asyncio.get_running_loop().create_task(self._spawn(g))
        log.info("pool: %d warm worker(s) per GPU, pre-importing %s", n, self.d.preload or "none")

    def _worker_env(self, g: Gpu, secret: str, slots_id: int) -> dict[str, str]:
        assert g.pool_tenant is not None
        env = dict(os.environ)
        extra = self.d.tenant_env(g.pool_tenant, None)
        for key in ("LD_PRELOAD", "LD_LIBRARY_PATH"):
            if key in extra and env.get(key):
                extra[key] = f"{extra[key]}:{env[key]}"
        env.update(extra)
        env["KREX_WORKER_SECRET"] = secret
        env["KREX_SLOTS"] = self.d.segments.name_of(slots_id)
        return env

    async def _spawn(self, g: Gpu) -> None:
        assert g.pool_tenant is not None
        if self.d.stopping():
            return
        wid, secret = self.next_worker, secrets.token_hex(16)
        self.next_worker += 1
        # A slot segment per worker, so that the commands it runs, like any tenant's, write
        # only their own state.
        slots_id = self.d.segments.take_id()
        try:
            self.d.segments.create(slots_id, _WORKER_SLOTS)
        except (SegmentError, KrexError) as e:
            log.error("cannot start a pool worker on GPU %d: %s", g.index, e)
            return
        listen = self.d.socket.parent / f"{self.d.socket.name}.w{wid}"
        argv = ["--socket", str(self.d.socket), "--listen", str(listen), "--worker", str(wid)]
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "krex.worker",
                *argv,
                "--preload",
                ",".join(self.d.preload),
                env=self._worker_env(g, secret, slots_id),
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the daemon's terminal's Ctrl-C is not for workers
            )
        except OSError as e:
            log.error("cannot start a pool worker on GPU %d: %s", g.index, e)
            self.d.segments.retire(slots_id)
            return
        w = PoolWorker(
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
        self._gone(g, w, await proc.wait())

    async def serve_worker(self, msg: dict[str, Any], conn: Conn) -> None:
        """A worker's control connection (`worker_ready`), for as long as it lives."""
        wid = msg.get("worker")
        w = self.workers.get(wid) if wire.is_int(wid) else None
        secret = msg.get("secret")
        if (
            w is None
            or not isinstance(secret, str)
            or not secrets.compare_digest(secret.encode(), w.secret.encode())
            or conn.peer.pid != w.proc.pid
            or w.writer is not None
        ):
            raise ProtocolError("unknown worker")
        g = self.d.gpus[w.gpu]
        own = self.d.segments.tenants.get(w.slots_id)
        slots = [s for s in own.slots_of(w.proc.pid) if s.alive] if own is not None else []
        if not slots or g.pool_tenant is None:
            log.error("pool worker %d has no slot in the segment: stopping it", w.id)
            _signal(w, signal.SIGKILL)
            return
        w.slot, w.writer, w.state = slots[0].index, conn.writer, "idle"
        g.pool_failures = 0
        log.info(
            "pool worker %d ready on GPU %d after %.1f s",
            w.id,
            g.index,
            time.monotonic() - w.t_start,
        )
        while (done := await wire.read(conn.reader)) is not None:
            if done.get("op") == "done":
                self._done(w, done.get("retire"))
        w.writer = None
        if w.state != "gone":
            _signal(w, signal.SIGKILL)

    async def lease(self, t: Tenant) -> dict[str, Any]:
        """An idle worker for tenant t's command, or why there is none."""
        g = self.d.gpus[t.gpu]
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
            await self.d.started(t, w.proc.pid)
            self.d.segments.hand_over(w.slots_id, w.slot, w.proc.pid, None, t.id)
            w.writer.write(wire.encode({"op": "job", "token": token}))
            await w.writer.drain()
        except (KrexError, ConnectionError) as e:
            log.warning("pool worker %d could not take tenant %d: %s", w.id, t.id, e)
            self.give_back(w)
            w.state = "retiring"
            _signal(w, signal.SIGKILL)
            t.worker = None
            return {"cold": f"the warm worker failed: {e}"}
        g.warm_runs += 1
        self.d.metrics.started(g.index, warm=True)
        return {"socket": str(w.listen), "token": token, "worker": w.id}

    def give_back(self, w: PoolWorker) -> None:
        """Worker w leaves its tenant: back into the pool's group, slot and cores (and, while a
        region holds its GPU, frozen with the pool)."""
        g = self.d.gpus[w.gpu]
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
            self.d.segments.hand_over(w.slots_id, w.slot, w.proc.pid, t, g.pool_tenant.id)
        self.d.regions.tenant_joined(g.pool_tenant)

    def trim(self, g: Gpu) -> None:
        """Memory is short on g (someone waits): retire one idle worker, at most one per
        memory.deadlock_s, so that its context's memory goes back to the GPU. It is replaced
        once nobody waits (_gone)."""
        now = time.monotonic_ns()
        if now - self._trimmed_ns.get(g.index, 0) < self.d.cfg.memory_deadlock_s * 1e9:
            return
        w = next((w for w in g.pool if w.state == "idle" and w.writer is not None), None)
        if w is None or w.writer is None:
            return
        self._trimmed_ns[g.index] = now
        log.info("pool worker %d retires: GPU %d is short of memory", w.id, g.index)
        w.state = "retiring"
        w.writer.write(wire.encode({"op": "exit"}))

    def _done(self, w: PoolWorker, retire: object) -> None:
        self.give_back(w)
        w.uses += 1
        own = self.d.segments.tenants.get(w.slots_id)
        if not retire and own is not None and own.overflow:
            # Processes of its command found no slot in the worker's segment. The count cannot
            # tell when they are gone, and every region of another tenant would stay unclean
            # for the worker's life: its segment goes with it (once no process of it is left).
            retire = f"{own.overflow} process(es) of its command had no slot"
        if retire or w.uses >= self.d.cfg.pool_max_uses:
            log.info("pool worker %d retires: %s", w.id, retire or f"{w.uses} uses")
            w.state = "retiring"
            if w.writer is not None:
                w.writer.write(wire.encode({"op": "exit"}))
        elif w.state == "busy":
            w.state = "idle"

    def _gone(self, g: Gpu, w: PoolWorker, rc: int) -> None:
        was = w.state
        if w.tenant is not None:
            self.give_back(w)
        w.state = "gone"
        if w.exited is not None and not w.exited.done():
            w.exited.set_result(rc)
        if w in g.pool:
            g.pool.remove(w)
        self.workers.pop(w.id, None)
        self.d.segments.retire(w.slots_id)  # goes once no process of it is left
        with contextlib.suppress(FileNotFoundError):
            w.listen.unlink()
        if was == "starting":
            g.pool_failures += 1
            log.warning(
                "pool worker %d on GPU %d died before it was ready (status %d)", w.id, g.index, rc
            )
        elif was != "retiring":
            log.warning("pool worker %d on GPU %d ended (status %d)", w.id, g.index, rc)
        if self.d.stopping():
            return
        delay = _RESTART_DELAY_S if g.pool_failures >= 3 else 0.0
        loop = asyncio.get_running_loop()
        loop.call_later(delay, lambda: loop.create_task(self._replace(g)))

    async def _replace(self, g: Gpu) -> None:
        """A replacement worker, once nobody on g waits for memory (a new worker's context
        would take memory a waiter needs)."""
        while self.d.memory.waiting(g.index) and not self.d.stopping():
            await asyncio.sleep(1.0)
        await self._spawn(g)

    async def exit_status(self, w: PoolWorker) -> int:
        """The exit status of a worker whose command's client saw it vanish."""
        assert w.exited is not None
        try:
            return await asyncio.wait_for(asyncio.shield(w.exited), _EXIT_WAIT_S)
        except asyncio.TimeoutError:
            _signal(w, signal.SIGKILL)
            return await w.exited

    async def stop(self) -> None:
        for w in list(self.workers.values()):
            _signal(w, signal.SIGTERM)
        for w in list(self.workers.values()):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(w.proc.wait(), _EXIT_WAIT_S)
        for g in self.d.gpus:
            if g.pool_tenant is not None:
                with contextlib.suppress(TenantsError):
                    g.pool_tenant.group.destroy()

    def status(self, g: Gpu) -> dict[str, Any]:
        return {
            "target": self.size() if g.pool_tenant else 0,
            "workers": len(g.pool),
            **{
                state: sum(w.state == state for w in g.pool)
                for state in ("starting", "idle", "busy")
            },
            "warm_runs": g.warm_runs,
            "cold_runs": g.cold_runs,
            "preload": self.d.preload,
        }


def _signal(w: PoolWorker, sig: int) -> None:
    """Signal a worker without asyncio's Process.kill(), whose poll() would reap it under
    asyncio's child watcher (which then reports status 255 instead of the real one)."""
    if w.state != "gone":
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.proc.pid, sig)

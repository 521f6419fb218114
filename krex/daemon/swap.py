"""Swaps: a command that waits for device memory taken off the GPU, whole, instead of killed,
to break a memory deadlock; put back once its memory fits (docs/memory.md).

The driver's checkpoint API (cuCheckpointProcessLock/Checkpoint/Restore/Unlock, CUDA 12.8+)
moves a locked process's device memory to host memory and back, the process kept: on an H100
(driver 580) 0.47-0.54 s a GiB out and 0.16-0.21 back, the content the same (docs/memory.md,
"A swap where the driver can"). A preemption frees the memory at once but loses the work the
command did so far (its time since admission less its waits for memory) and runs it again; a
swap keeps the work but costs its round trip, and while its memory goes out every other waiter
of the GPU waits too (a deadlock: nobody can run). So a deadlock's victim is swapped only where
its work is worth more than that (`swap_cost_s`), at most MAX_SWAPS times, and where the driver
allows it (not under MPS, not a process inside a driver call: the lock times out and nothing is
taken); else it is preempted, as before. (On an H100, 2026-12-07, swapping by age alone took
three first-wave commands out one after another, 7 s each, while seven others waited: 16 slots
ran at 16.2 commands a minute against 28.5 with preemptions.)

Each swap is one keeper process (krex/daemon/swapkeeper.py), so that the daemon never loads the
driver, and so that a command is never left locked by a daemon that died. The swap's phases:
"out" (being taken off: no region may begin on its GPU), "off" (its memory is host memory: it
holds nothing on the GPU, nobody lets it retry, admission waits), "in" (being put back: no
region may begin). A swapped command's processes are locked: they can make no driver call, so
no region's drain asks them and no waiter of theirs is let retry until they are back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from krex.daemon.model import Tenant

log = logging.getLogger("krex.daemon")

GIB = 1 << 30
MAX_SWAPS = 2  # a command's swaps before a deadlock preempts it instead (no thrash)
# Seconds per GiB to copy a command's memory out, and out and back (H100s, driver 580: out
# 0.47-0.54, back 0.16-0.21).
OUT_S_PER_GIB = 0.55
ROUND_TRIP_S_PER_GIB = 0.75
LOCK_TIMEOUT_MS = 500  # a process inside a driver call this long is not taken: preempted
_BUSY_WAIT_S = 60.0  # the longest a region waits for a swap in progress on its GPU


def swap_cost_s(held: int, blocked: int) -> float:
    """What taking `held` bytes off the GPU and back costs in commands' seconds: the victim's
    round trip, and each of the `blocked` other waiters' wait while the memory goes out."""
    return held / GIB * (ROUND_TRIP_S_PER_GIB + OUT_S_PER_GIB * blocked)


def work_s(age_s: float, waited_ns: int, waiting_since_ns: list[int], now_ns: int) -> float:
    """What a rerun would lose of a command `age_s` old: its time less its waits for memory.
    `waited_ns` sums its processes' waits, each one going on counted up to `now_ns`; those going
    on (begun at `waiting_since_ns`) all run to now, so they overlap: they count once, from the
    oldest's start (summed, two processes waiting together counted twice and a command of
    several processes seemed to have done nothing)."""
    going = sum(max(0, now_ns - since) for since in waiting_since_ns)
    union = max(0, now_ns - min(waiting_since_ns)) if waiting_since_ns else 0
    return max(0.0, age_s - max(0, waited_ns - going + union) / 1e9)


@dataclass(eq=False)
class Swap:
    """One command taken off a GPU (or being taken off, or put back)."""

    tenant: Tenant
    gpu: int
    pids: list[int]
    held: int  # what it held on the GPU when taken off (the driver's figure where known)
    need: int  # what it needs back: that, and what it waits for
    waited_since_ns: int  # its wait's start: its place among the GPU's waiters
    why: str
    phase: str = "out"  # "out", "off", "in", "done"
    t0: float = field(default_factory=time.monotonic)
    proc: asyncio.subprocess.Process | None = None
    retry_at: float = 0.0  # a put-back the GPU had no room for: not asked again before this
    t_out: float = 0.0  # when it was off the GPU


class Swaps:
    """The node's swaps. `on_refused(tenant id, why)` preempts a command that could not be
    taken off (the deadlock is still to be broken); `on_failed` kills one taken off part-way
    or not put back (its memory is not where it can go on)."""

    def __init__(
        self,
        *,
        enabled: bool,
        sim_shm: str,
        on_refused: Callable[[int, str], None],
        on_failed: Callable[[int, str], None],
    ) -> None:
        self.enabled = enabled
        self.sim_shm = sim_shm
        self.on_refused, self.on_failed = on_refused, on_failed
        self.by_tenant: dict[int, Swap] = {}
        self.unsupported = ""  # the driver said it cannot: no more tries
        self.count = 0  # commands taken off, in all
        self._tasks: set[asyncio.Task[None]] = set()

    # What the arbiter asks.
    def swapped(self) -> set[int]:
        """Tenants taken off a GPU or on the way (they hold nothing there, nobody grants
        them)."""
        return set(self.by_tenant)

    def busy(self, gpu: int) -> bool:
        """A swap is copying on this GPU (out or in): no region begins, no deadlock is broken
        again until its memory has moved."""
        return any(s.gpu == gpu and s.phase in ("out", "in") for s in self.by_tenant.values())

    def off(self, gpu: int) -> list[Swap]:
        """The GPU's commands off it, waiting to be put back, the longest waiting first."""
        ss = [s for s in self.by_tenant.values() if s.gpu == gpu and s.phase == "off"]
        return sorted(ss, key=lambda s: s.waited_since_ns)

    def can_take(self, t: Tenant, held: int, work_s: float, blocked: int) -> str:
        """Why t cannot be swapped ("" when it can): `work_s`, what a preemption would lose
        (its time since admission less its waits for memory), `blocked`, the other commands
        waiting on the GPU while its memory goes out."""
        if not self.enabled:
            return "swaps are off (memory.swap)"
        if self.unsupported:
            return self.unsupported
        if t.id in self.by_tenant:
            return "it is being swapped"
        if len(t.gpus) != 1:
            return "it has more than one GPU"
        if t.mem_swaps >= MAX_SWAPS:
            return f"it was swapped {t.mem_swaps} times already"
        cost = swap_cost_s(held, blocked)
        if work_s < cost:
            return (f"its {work_s:.1f} s of work lost by a rerun cost less than a swap: "
                    f"{cost:.1f} s, {blocked} other(s) waiting")  # fmt: skip
        return ""

    def take_off(
        self, t: Tenant, gpu: int, pids: list[int], held: int, need: int, since_ns: int, why: str
    ) -> None:
        """Start taking t off `gpu` (a keeper of its own); its memory comes back when the
        keeper says "out"."""
        s = Swap(t, gpu, pids, held, need, since_ns, why)
        self.by_tenant[t.id] = s
        t.mem_swaps += 1
        self.count += 1
        log.warning(
            "tenant %d swapped out (its %.2f GiB to host memory, its processes %s locked; put "
            "back when %.2f GiB fit): %s",
            t.id,
            held / GIB,
            pids,
            need / GIB,
            why,
        )
        self._spawn(self._keep(s))

    def put_back(self, s: Swap, now: float) -> None:
        """Ask s's keeper to put it back (the arbiter saw its need free)."""
        if s.phase != "off" or s.proc is None or s.proc.stdin is None or now < s.retry_at:
            return
        s.phase, s.t0 = "in", now
        with contextlib.suppress(OSError, RuntimeError):
            s.proc.stdin.write(b"restore\n")

    def forget(self, tid: int) -> None:
        """t is gone (killed, preempted, finished): its keeper ends, touching nothing."""
        s = self.by_tenant.pop(tid, None)
        if s is None or s.proc is None:
            return
        s.phase = "done"
        if s.proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                s.proc.stdin.write(b"drop\n")
                s.proc.stdin.close()

    async def idle(self, gpu: int) -> float:
        """Wait (at most _BUSY_WAIT_S) until no swap copies on `gpu`: a region's kernels must
        not share the GPU with a checkpoint's or restore's copies. Returns the seconds."""
        t0 = time.monotonic()
        while self.busy(gpu) and time.monotonic() - t0 < _BUSY_WAIT_S:
            await asyncio.sleep(0.02)
        return time.monotonic() - t0

    async def close(self) -> None:
        """At shutdown: every keeper's stdin closed. A command still off the GPU is put back
        by its keeper as soon as its memory fits (the keeper outlives the daemon)."""
        for s in list(self.by_tenant.values()):
            if s.proc is not None and s.proc.stdin is not None:
                with contextlib.suppress(OSError, RuntimeError):
                    s.proc.stdin.close()
        self.by_tenant.clear()
        for task in list(self._tasks):
            task.cancel()

    # The keeper.
    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep(self, s: Swap) -> None:
        argv = [sys.executable, "-m", "krex.daemon.swapkeeper"]
        argv += [f"--lock-timeout-ms={LOCK_TIMEOUT_MS}"]
        argv += [f"--sim-shm={self.sim_shm}"] if self.sim_shm else []
        argv += [str(p) for p in s.pids]
        try:
            s.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,  # not in the daemon's process group: outlives it
            )
        except OSError as e:
            self._refused(s, f"its swap keeper did not start: {e}", unsupported=False)
            return
        assert s.proc.stdout is not None
        async for raw in s.proc.stdout:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if self.by_tenant.get(s.tenant.id) is not s:
                break  # forgotten meanwhile (its command gone)
            self._event(s, ev)
            if s.phase == "done":
                break
        with contextlib.suppress(ProcessLookupError):
            await s.proc.wait()
        if self.by_tenant.get(s.tenant.id) is s and s.phase != "done":
            # The keeper ended without a word (killed, crashed): where the command is now is
            # not known; it cannot be trusted to go on.
            self._failed(s, "its swap keeper ended unexpectedly")

    def _event(self, s: Swap, ev: dict[str, object]) -> None:
        kind, now = ev.get("event"), time.monotonic()
        t = s.tenant
        if kind == "out":
            s.phase, s.t_out = "off", now
            secs = float(ev.get("s", 0.0))  # type: ignore[arg-type]
            t.mem_swapped_s += secs
            log.info("tenant %d off GPU %d (%.2f GiB out in %.2f s)", t.id, s.gpu,
                     s.held / GIB, secs)  # fmt: skip
        elif kind == "in":
            secs = float(ev.get("s", 0.0))  # type: ignore[arg-type]
            t.mem_swapped_s += secs
            t.mem_off_s += now - s.t_out
            log.info("tenant %d back on GPU %d (in %.2f s)", t.id, s.gpu, secs)
            s.phase = "done"
            del self.by_tenant[t.id]
        elif kind == "short":
            s.phase, s.retry_at = "off", now + 1.0
        elif kind == "refused":
            rc = ev.get("rc")
            self._refused(s, str(ev.get("why", "")), unsupported=rc in (801, 500))
        elif kind == "failed":
            self._failed(s, str(ev.get("why", "")))

    def _refused(self, s: Swap, why: str, *, unsupported: bool) -> None:
        """Nothing was taken: the command runs on as before; the deadlock is broken by its
        preemption instead."""
        s.phase = "done"
        self.by_tenant.pop(s.tenant.id, None)
        s.tenant.mem_swaps -= 1
        self.count -= 1
        if unsupported:
            self.unsupported = f"the driver cannot checkpoint here ({why})"
        log.warning("tenant %d could not be swapped out (%s): preempted instead", s.tenant.id,
                    why)  # fmt: skip
        self.on_refused(s.tenant.id, f"{s.why}; it could not be swapped out: {why}")

    def _failed(self, s: Swap, why: str) -> None:
        s.phase = "done"
        self.by_tenant.pop(s.tenant.id, None)
        log.error("tenant %d: its swap failed (%s): preempted", s.tenant.id, why)
        self.on_failed(s.tenant.id, f"{s.why}; its swap failed: {why}")

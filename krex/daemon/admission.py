"""Admission: who gets a GPU's slots, and in what order (docs/memory.md, docs/protocol.md).

Per GPU a FIFO queue; a command is admitted when the GPU has a free slot and, as far as memory
goes, room for what it is expected to need (krex/daemon/memory.py). A slot is promised
(reserved) the moment it is handed on, so that nobody arriving meanwhile takes it; a command of
several GPUs takes its slots in index order. The daemon turns an admitted request into a
tenant; this module knows nothing of tenants' groups, segments or connections beyond waiting on
one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from krex.core import messages
from krex.core.config import Config
from krex.core.errors import ProtocolError
from krex.daemon.conn import Conn
from krex.daemon.memory import Memory, argv_key
from krex.daemon.model import AdmissionTicket, AdmitRequest, Gpu

log = logging.getLogger("krex.daemon")


class Admission:
    """Every GPU's admission queue over the node's memory arbiter."""

    def __init__(self, gpus: list[Gpu], memory: Memory) -> None:
        self.gpus = gpus
        self.memory = memory

    def pick(self, wanted: int | list[int] | None, count: int | None) -> list[Gpu]:
        """The GPUs a command asked for (`gpu`: an index or a list of them; `gpus`: how many),
        in index order; by default the least loaded."""
        n = len(self.gpus)
        if count is not None and count > n:
            raise ProtocolError(f"{count} GPUs asked for, but this node has {n}")
        if wanted is not None:
            ids = [wanted] if not isinstance(wanted, list) else wanted
            missing = [i for i in ids if not 0 <= i < n]
            if missing:
                raise ProtocolError(f"GPU {missing[0]} does not exist (this node has {n})")
            if len(set(ids)) != len(ids):
                raise ProtocolError(f"gpu names a GPU twice: {ids}")
            if count is not None and count != len(ids):
                raise ProtocolError(f"gpus={count} but gpu names {len(ids)}: {ids}")
            return [self.gpus[i] for i in sorted(ids)]
        load = sorted(self.gpus, key=lambda g: (g.load(), g.index))
        return sorted(load[: count or 1], key=lambda g: g.index)

    def room(self, g: Gpu, req: AdmitRequest) -> bool:
        """Whether g has a free slot and, as far as memory goes, room for this command."""
        free = len(g.tenants) + g.reserved < g.slots
        return free and self.memory.fits(
            g, req, reserved=g.reserved_mem, reserved_alone=g.reserved_alone
        )

    def why_queued(self, g: Gpu, req: AdmitRequest) -> str:
        """Why a command is queued on g, as it stands when it joins the queue (for krex run's
        notice of a long wait)."""
        if g.admission:
            return f"{len(g.admission)} command(s) queued before it"
        if len(g.tenants) + g.reserved >= g.slots:
            return f"all {g.slots} slots taken"
        if req.alone:
            return "a memory rerun: it waits to have the GPU's memory to itself"
        if g.reserved_alone or any(x.mem_alone for x in g.tenants):
            return "a memory rerun has the GPU's memory to itself"
        if self.memory.waiting(g.index):
            return "commands on the GPU wait for device memory, and go first"
        need = self.memory.requested(req)
        return (
            f"waiting for the device memory it is expected to need ({need / (1 << 30):.1f} GiB, "
            "docs/memory.md: declared with --mem, learned from its earlier runs, or the node's "
            "prior for a command never seen)"
        )

    def reserve(self, g: Gpu, req: AdmitRequest, sign: int = 1) -> None:
        """Promise (sign 1) or hand on (-1) one of g's slots to the command of req: a command
        that must have the GPU's memory to itself counts as such from its promise on, so that
        nothing else is admitted beside it in the same pass."""
        g.reserved += sign
        if sign > 0:
            g.promised_mem[id(req)] = self.memory.need(req.key, req.mem, req.rerun_need)
        else:
            g.promised_mem.pop(id(req), None)
        g.reserved_alone += sign * req.alone

    async def take(self, g: Gpu, req: AdmitRequest, conn: Conn) -> None:
        """Reserve one of g's slots (g.reserved), after waiting in its queue if all are taken
        or the memory the command is expected to need is not there (docs/memory.md)."""
        if not g.admission and self.room(g, req):
            self.reserve(g, req)
            return
        ticket = AdmissionTicket(granted=asyncio.get_running_loop().create_future(), req=req)
        why = self.why_queued(g, req)
        g.admission.append(ticket)
        await conn.send({"ok": True, "queued": len(g.admission), "gpu": g.index, "why": why})
        try:
            await conn.until(ticket.granted)  # admit_next reserves the slot for us
            ticket.granted.result()  # or says why it could not
        except BaseException:
            if ticket in g.admission:
                g.admission.remove(ticket)
            elif (
                ticket.granted.done()
                and not ticket.granted.cancelled()
                and ticket.granted.exception() is None
            ):
                # We were handed a slot but are leaving: pass it on.
                self.reserve(g, req, -1)
                self.admit_next(g)
            raise

    def admit_next(self, g: Gpu) -> None:
        """Hand free slots of g to the commands waiting for one, in order (each reserved at
        once, so that nobody arriving meanwhile takes it). A request that cannot be looked at
        (a bug) is answered with an error and leaves the queue; the others go on."""
        while g.admission:
            ticket = g.admission[0]
            try:
                if not self.room(g, ticket.req):
                    return
                g.admission.popleft()
                if not ticket.granted.done():
                    self.reserve(g, ticket.req)
                    ticket.granted.set_result(None)
            except Exception:
                log.exception("admission of a queued command on GPU %d failed", g.index)
                if ticket in g.admission:
                    g.admission.remove(ticket)
                if not ticket.granted.done():
                    ticket.granted.set_exception(ProtocolError("internal error (see the log)"))

    def rerun_need(self, need: int) -> int:
        """What a rerun is expected to need: what its earlier run held and was waiting for
        when it ended (the client passes it on), at most what admission can give on a GPU."""
        most = min(g.capacity for g in self.memory.state) - self.memory.headroom_for(1)
        return max(0, min(need, most))


def admit_request(
    admit: messages.Admit, cfg: Config, rerun_need: Callable[[int], int]
) -> AdmitRequest:
    """What an `admit` asks for, with this daemon's defaults (`rerun_need`:
    Admission.rerun_need); the configuration's own are checked as it loads."""
    if admit.sim != cfg.sim:
        kind = "simulated" if cfg.sim else "real"
        raise ProtocolError(f"this daemon serves {kind} GPUs")
    timeout = admit.region_timeout_s
    settle, capped = admit.settle_s, admit.capped_settle_s
    return AdmitRequest(
        admit.argv,
        float(cfg.region_timeout_s if timeout is None else timeout),
        admit.auto_regions,
        admit.mem_bytes,
        admit.mem_alone,
        admit.mem_rerun > 0,
        rerun_need(admit.mem_rerun),
        key=admit.mem_key or argv_key(admit.argv),
        family=admit.mem_family or "",
        settle=float(cfg.region_settle_s if settle is None else settle),
        capped_settle=float(cfg.region_capped_settle_s if capped is None else capped),
        retry=admit.mem_retry,
    )

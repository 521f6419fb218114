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
from typing import Any

from krex.core import wire
from krex.core.config import MAX_BYTES, MAX_SECONDS, MAX_SETTLE_S, Config
from krex.core.errors import ProtocolError
from krex.daemon.conn import Conn
from krex.daemon.memory import Memory, argv_key, is_key
from krex.daemon.model import AdmissionTicket, AdmitRequest, Gpu

log = logging.getLogger("krex.daemon")


class Admission:
    """Every GPU's admission queue over the node's memory arbiter."""

    def __init__(self, gpus: list[Gpu], memory: Memory) -> None:
        self.gpus = gpus
        self.memory = memory

    def pick(self, wanted: Any, count: Any) -> list[Gpu]:
        """The GPUs a command asked for (`gpu`: an index or a list of them; `gpus`: how many),
        in index order; by default the least loaded."""
        n = len(self.gpus)
        if count is not None:
            if not wire.is_int(count) or count < 1:
                raise ProtocolError(f"gpus must be a positive integer, got {count!r}")
            if count > n:
                raise ProtocolError(f"{count} GPUs asked for, but this node has {n}")
        if wanted is not None:
            ids = [wanted] if not isinstance(wanted, list) else wanted
            if not ids or not all(wire.is_int(i) for i in ids):
                raise ProtocolError(f"gpu must be a GPU index or a list of them, got {wanted!r}")
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
        g.admission.append(ticket)
        await conn.send({"ok": True, "queued": len(g.admission), "gpu": g.index})
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
        most = min(g.capacity for g in self.memory.state) - self.memory.headroom
        return max(0, min(need, most))


def admit_request(
    msg: dict[str, Any], cfg: Config, rerun_need: Callable[[int], int]
) -> AdmitRequest:
    """What an `admit` asks for, checked (`rerun_need`: Admission.rerun_need)."""
    argv = msg.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ProtocolError("argv must be a non-empty list of strings")
    for i, arg in enumerate(argv):
        if why := wire.arg_problem(arg):
            raise ProtocolError(f"argv[{i}] {why}")
    if bool(msg.get("sim", False)) != cfg.sim:
        kind = "simulated" if cfg.sim else "real"
        raise ProtocolError(f"this daemon serves {kind} GPUs")
    timeout = msg.get("region_timeout_s")
    if timeout is None:
        timeout = cfg.region_timeout_s
    if not wire.is_number(timeout) or not 0 < timeout <= MAX_SECONDS:
        raise ProtocolError(
            f"region_timeout_s must be a positive number of seconds, at most {MAX_SECONDS:g}"
        )
    auto = msg.get("auto_regions")
    if auto is not None and not isinstance(auto, str):
        raise ProtocolError("auto_regions must be a string")
    mem = msg.get("mem_bytes", 0)
    if mem is None:
        mem = 0
    if not wire.is_int(mem) or not 0 <= mem <= MAX_BYTES:
        raise ProtocolError(f"mem_bytes must be an integer 0..{MAX_BYTES} (1 PiB)")
    alone = msg.get("mem_alone", False)
    if not isinstance(alone, bool):
        raise ProtocolError("mem_alone must be true or false")
    rerun = msg.get("mem_rerun", 0)
    if not wire.is_int(rerun) or not 0 <= rerun <= MAX_BYTES:
        raise ProtocolError(f"mem_rerun must be an integer 0..{MAX_BYTES} (bytes)")
    settles: dict[str, float] = {}
    for key, field_name, default in (
        ("settle_s", "settle", cfg.region_settle_s),
        ("capped_settle_s", "capped_settle", cfg.region_capped_settle_s),
    ):
        value = msg.get(key)
        if value is None:
            value = default
        if not wire.is_number(value) or not 0 <= value <= MAX_SETTLE_S:
            raise ProtocolError(f"{key} must be a number of seconds, 0..{MAX_SETTLE_S:g}")
        settles[field_name] = float(value)
    mem_key = msg.get("mem_key")
    if mem_key is not None and not is_key(mem_key):
        raise ProtocolError("mem_key must be 32 lower-case hexadecimal digits")
    return AdmitRequest(
        argv,
        float(timeout),
        auto,
        mem,
        alone,
        rerun > 0,
        rerun_need(rerun),
        key=mem_key or argv_key(argv),
        **settles,
    )

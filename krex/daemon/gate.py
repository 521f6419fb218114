"""Exclusive use of one GPU: the region protocol's steps 1-3 and its exit, over a Segment.

This is what the controller runs when a tenant enters a region; freezing and pinning (steps 4
and 5) are layered on by the controller. Every wait is bounded: a sibling that will not quiesce
or drain in time makes the hold unclean, never a hang.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from krex.core.procs import running
from krex.core.shm import Segment, WaitTimeout


@dataclass
class Hold:
    """What taking the GPU cost, and whether the result can be trusted."""

    gpu: int
    owner: int
    epoch: int = 0
    quiesce_s: float = 0.0
    drain_s: float = 0.0
    drained: int = 0
    clean: bool = True
    problems: list[str] = field(default_factory=list)


def quiesce_and_drain(
    seg: Segment | Sequence[Segment],
    hold: Hold,
    *,
    quiesce_timeout_s: float,
    drain_timeout_s: float,
) -> None:
    """Steps 2 and 3 behind a gate closed for hold.owner (hold.epoch): fills in the hold.

    `seg` may be several segments holding slots (the gates' own, and each tenant's): every
    sibling slot in any of them is waited for, all within the one pair of time-outs."""
    segs = [seg] if isinstance(seg, Segment) else list(seg)
    t0 = time.perf_counter()
    for s in segs:
        left = quiesce_timeout_s - (time.perf_counter() - t0)
        try:
            s.quiesce(hold.gpu, hold.owner, max(left, 0.001))
        except WaitTimeout as e:
            hold.clean = False
            hold.problems.append(f"quiesce: {e}")
    t1 = time.perf_counter()
    asked = [s.drain_request(hold.gpu, hold.owner) for s in segs]
    hold.drained = sum(t.asked for t in asked)
    for s, tickets in zip(segs, asked, strict=True):
        left = drain_timeout_s - (time.perf_counter() - t1)
        try:
            s.drain_await(tickets, max(left, 0.001))
        except WaitTimeout as e:
            hold.clean = False
            hold.problems.append(f"drain: {e}")
    hold.quiesce_s, hold.drain_s = t1 - t0, time.perf_counter() - t1
    overflow = sum(_overflowing(s) for s in segs)
    if overflow:
        hold.clean = False
        hold.problems.append(f"{overflow} process(es) had no slot and could not drain")


@contextmanager
def exclusive(
    seg: Segment,
    gpu: int,
    owner: int,
    *,
    quiesce_timeout_s: float = 5.0,
    drain_timeout_s: float = 10.0,
    deadline_s: float | None = None,
) -> Iterator[Hold]:
    """Close `gpu` to every tenant but `owner`, quiesce and drain the siblings; reopen on exit."""
    hold = Hold(gpu=gpu, owner=owner)
    hold.epoch = seg.gate_close(gpu, owner, deadline_s=deadline_s)
    try:
        quiesce_and_drain(
            seg, hold, quiesce_timeout_s=quiesce_timeout_s, drain_timeout_s=drain_timeout_s
        )
        yield hold
    finally:
        seg.gate_open(gpu)


def _overflowing(seg: Segment) -> int:
    """Processes of seg that found no slot and may still run: those recorded by pid count while
    they run; any beyond the record count for as long as the segment lives."""
    count, recorded = seg.overflow
    return max(0, count - len(recorded)) + sum(running(p) for p in recorded)

"""What a region's record says about the GPU beyond exclusivity: its power and where memory is.

A clean region proves that no other work ran on its GPU; it does not prove that the GPU ran as
it would have alone. Two effects, measured on the H200 (docs/user-guide.md, "Power-limited
kernels"), move a clean region's timing and are out of krex's hands once the region begins:

- power history: after heavy work (the siblings', or the command's own) the GPU holds its
  clocks down under its power limit, and a compute-bound kernel measures up to about 12 %
  slower than after a quiet spell;
- placement: where a multi-GiB buffer lands in device memory, which depends on what else is
  resident, moves a bandwidth-bound kernel over it by up to about 5 %.

A third, the process's own history (a compute-bound kernel's later measurements in a process
read slower than its first), krex no longer adds: every command runs in a fresh process, warm
ones too (docs/pool.md).

Each becomes a named warning in the record's `warnings` (counted by `krex bench`), with the
numbers behind it among the record's fields; a warning does not make a region unclean.
"""

from __future__ import annotations

from collections import deque
from typing import Any

GIB = 1 << 30
HISTORY_S = 10.0  # the window before a grant whose mean power the record gives
KEEP_S = 30.0  # how long samples are kept
HEAVY = 0.5  # of the power limit: mean power before the grant that counts as heavy work
PLACEMENT_BYTES = GIB  # the owner's and the others' device memory both at least this


class PowerHistory:
    """Each GPU's energy counter, sampled about once a second, for the mean power over the
    seconds before a region's grant."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, int]]] = {}

    def note(self, gpu: int, t: float, energy_mj: int) -> None:
        q = self._samples.setdefault(gpu, deque())
        q.append((t, energy_mj))
        while q and t - q[0][0] > KEEP_S:
            q.popleft()

    def mean_w(self, gpu: int, t: float, energy_mj: int) -> float | None:
        """Mean power (W) from the sample nearest HISTORY_S before t until t, when the
        samples cover at least half of that window; None otherwise."""
        best = None
        # A copy (made whole under the GIL): a grant's sample reads this in a worker thread
        # while the event loop's tick may append.
        for ts, e in tuple(self._samples.get(gpu, ())):
            if t - ts >= HISTORY_S / 2 and (best is None or abs(t - ts - HISTORY_S) < abs(
                t - best[0] - HISTORY_S
            )):  # fmt: skip
                best = (ts, e)
        if best is None or energy_mj < best[1]:
            return None
        return (energy_mj - best[1]) / 1000 / (t - best[0])


def power_fields(grant: dict[str, Any], end: dict[str, Any], duration_s: float) -> dict[str, Any]:
    """The record's power fields from a GPU's samples at the grant and at the end (those
    NVML gave): mean power during the region and before it, time spent capped, the GPU's and
    its memory's temperature."""
    out: dict[str, Any] = {}
    # NVML's energy counter moves in steps: a mean over less than a second says little.
    if "energy_mj" in grant and "energy_mj" in end and duration_s >= 1.0:
        out["power_w"] = round((end["energy_mj"] - grant["energy_mj"]) / 1000 / duration_s, 1)
    if grant.get("power_w_before") is not None:
        out["power_w_before"] = round(grant["power_w_before"], 1)
    for key in ("power_capped_ns", "thermal_capped_ns"):
        if key in grant and key in end:
            out[key.replace("_ns", "_ms")] = round(max(0, end[key] - grant[key]) / 1e6, 3)
    for key in ("temp_c", "mem_temp_c"):
        if key in grant and key in end:
            out[key] = [grant[key], end[key]]
    if "power_limit_mw" in grant:
        out["power_limit_w"] = round(grant["power_limit_mw"] / 1000, 1)
    return out


def swapped(times: int) -> dict[str, str]:
    """The warning of a region whose command was taken off the GPU and put back before it
    (docs/memory.md, "A swap where the driver can"): its buffers were restored to the same
    addresses, not necessarily to the same physical memory."""
    return {
        "name": "memory_swapped",
        "detail": f"the command's device memory was checkpointed to host memory and restored "
        f"({times} time(s)) before this region ended: its buffers may lie elsewhere in the "
        "GPU's memory than before (whether that moves a timing was not measured)",
    }


def warnings(
    fields: dict[str, Any], throttled: bool, memory: tuple[int, int] | None
) -> list[dict[str, str]]:
    """Named warnings from a record's fields: `throttled` (its clock samples said so) and
    memory, (the owner's, the others') device bytes at the grant."""
    out: list[dict[str, str]] = []
    capped = fields.get("power_capped_ms", 0) + fields.get("thermal_capped_ms", 0)
    if capped > 0 or throttled:
        # NVML's violation counters move in coarse steps: a short region can show a capped
        # clock sample while they stand still; say which of the two said so.
        how = f"for {capped:.0f} ms of the region" if capped > 0 else "in its clock samples"
        out.append({
            "name": "gpu_capped",
            "detail": f"the GPU's clocks were held down (power or thermal limit) {how}: "
            "compute-bound kernels read slow",
        })  # fmt: skip
    before, limit = fields.get("power_w_before"), fields.get("power_limit_w")
    if before is not None and limit and before >= HEAVY * limit:
        out.append({
            "name": "power_history",
            "detail": f"the GPU drew {before:.0f} W on average in the {HISTORY_S:.0f} s "
            f"before the grant (limit {limit:.0f} W): after heavy work, compute-bound kernels "
            "can read up to about 12 % slow",
        })  # fmt: skip
    if memory is not None and min(memory) >= PLACEMENT_BYTES:
        mine, others = memory
        out.append({
            "name": "memory_placement",
            "detail": f"others held {others / GIB:.1f} GiB of device memory beside the owner's "
            f"{mine / GIB:.1f} GiB: where a large buffer lands moves bandwidth-bound kernels "
            "by up to about 5 %",
        })  # fmt: skip
    return out

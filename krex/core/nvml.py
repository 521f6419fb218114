"""The GPU's SM clock, throttle reasons and power around a region, where NVML gives them.

NVML (the nvidia-ml-py package, module `pynvml`, in the `cuda` extra) is optional: without it,
or without a GPU, or on the simulated GPU, `Nvml.open()` returns None and regions carry no
clock fields.
"""

from __future__ import annotations

import contextlib
from itertools import pairwise
from typing import Any

# NVML: "Each sample period may be between 1 second and 1/6 second, depending on the product".
SAMPLE_PERIOD_S = (1 / 6, 1.0)


class Nvml:
    """An initialised NVML; `sample(gpu)` reads one GPU's SM clock and throttle reasons."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._period: dict[int, float] = {}  # per GPU, the sampling period its samples showed

    @classmethod
    def open(cls) -> Nvml | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception:
            return None
        return cls(pynvml)

    def sample(self, gpu: int) -> dict[str, int] | None:
        """{"sm_clock_mhz", "throttle_reasons"} of GPU `gpu` (an NVML index), or None; with,
        where NVML has them, the counters a region's power fields are made of: "energy_mj"
        (energy since the driver loaded), "power_capped_ns" and "thermal_capped_ns" (time
        the clocks were held down by the power or the thermal limit, since the driver
        loaded), "power_limit_mw", "temp_c", and the HBM's "mem_temp_c" and "mem_clock_mhz"
        (what else a timing ran under: docs/user-guide.md, "Power-limited kernels")."""
        lib = self._lib
        try:
            h = lib.nvmlDeviceGetHandleByIndex(gpu)
            clock = int(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM))
            # Renamed in newer NVML (throttle -> clocks event); ask under either name.
            get = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
            get = get or lib.nvmlDeviceGetCurrentClocksThrottleReasons
            reasons = int(get(h))
        except Exception:
            return None
        out = {"sm_clock_mhz": clock, "throttle_reasons": reasons}
        for key, read in (
            ("energy_mj", lambda: lib.nvmlDeviceGetTotalEnergyConsumption(h)),
            ("power_capped_ns", lambda: _violation(lib, h, "NVML_PERF_POLICY_POWER")),
            ("thermal_capped_ns", lambda: _violation(lib, h, "NVML_PERF_POLICY_THERMAL")),
            ("power_limit_mw", lambda: lib.nvmlDeviceGetEnforcedPowerLimit(h)),
            ("temp_c", lambda: lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU)),
            ("mem_temp_c", lambda: _field(lib, h, "NVML_FI_DEV_MEMORY_TEMP")),
            ("mem_clock_mhz", lambda: lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM)),
        ):
            with contextlib.suppress(Exception):  # each is optional: older drivers lack some
                out[key] = int(read())
        return out

    def describe(self, gpu: int) -> str | None:
        """ "<GPU name>, driver <version>" of GPU `gpu` (an NVML index), or None."""
        lib = self._lib
        try:
            name = lib.nvmlDeviceGetName(lib.nvmlDeviceGetHandleByIndex(gpu))
            return f"{name}, driver {lib.nvmlSystemGetDriverVersion()}"
        except Exception:
            return None

    def memory(self, gpu: int) -> tuple[int, int] | None:
        """(total, used) device memory of GPU `gpu` in bytes (NVML's figure, contexts
        included), or None."""
        lib = self._lib
        try:
            info = lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(gpu))
            return int(info.total), int(info.used)
        except Exception:
            return None

    def process_memory(self, gpu: int) -> dict[int, int] | None:
        """Device bytes per compute process on GPU `gpu` (NVML's per-process figure: the
        cross-check of what the shim counted), or None."""
        lib = self._lib
        try:
            h = lib.nvmlDeviceGetHandleByIndex(gpu)
            procs = lib.nvmlDeviceGetComputeRunningProcesses(h)
        except Exception:
            return None
        return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}

    def active(self, gpu: int, since: float) -> set[int]:
        """Pids NVML saw doing work (SM or memory utilisation above 0) on GPU `gpu` since the
        wall-clock time `since`; empty where it has no samples (they come every 1/6 s to 1 s,
        depending on the product, so work shorter than that may have none)."""
        return set(self.work_samples(gpu, since))

    def work_samples(self, gpu: int, since: float) -> dict[int, float]:
        """Of each pid NVML saw doing work on GPU `gpu` since the wall-clock time `since`, the
        timestamp (wall-clock seconds) of its latest sample with work; a sample shows the
        sampling period before its timestamp. Notes the period its samples show
        (sample_period)."""
        lib = self._lib
        since_us = int(since * 1e6)
        try:
            h = lib.nvmlDeviceGetHandleByIndex(gpu)
            # From earlier than `since`: consecutive samples of one process show the period.
            samples = lib.nvmlDeviceGetProcessUtilization(
                h, since_us - int(2e6 * SAMPLE_PERIOD_S[1])
            )
        except Exception:
            return {}
        stamps: dict[int, set[int]] = {}
        out: dict[int, float] = {}
        for x in samples:
            pid, t = int(x.pid), int(x.timeStamp)
            stamps.setdefault(pid, set()).add(t)
            if t >= since_us and (int(x.smUtil) > 0 or int(x.memUtil) > 0):
                out[pid] = max(out.get(pid, 0.0), t / 1e6)
        gaps = [(b - a) / 1e6 for ts in stamps.values() for a, b in pairwise(sorted(ts))]
        if gaps:
            low, high = SAMPLE_PERIOD_S
            seen = min(max(min(gaps), low), high)
            self._period[gpu] = min(seen, self._period.get(gpu, high))
        return out

    def sample_period(self, gpu: int) -> float:
        """The process-sampling period of GPU `gpu` as its samples have shown it (the shortest
        gap between two samples of one process so far, within NVML's 1/6 s to 1 s); NVML's
        longest, 1 s, until two have been seen."""
        return self._period.get(gpu, SAMPLE_PERIOD_S[1])

    def processes(self, gpu: int) -> set[int] | None:
        """Pids of the compute processes on GPU `gpu` (an NVML index), or None."""
        lib = self._lib
        try:
            h = lib.nvmlDeviceGetHandleByIndex(gpu)
            return {int(p.pid) for p in lib.nvmlDeviceGetComputeRunningProcesses(h)}
        except Exception:
            return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._lib.nvmlShutdown()


def _violation(lib: Any, h: Any, policy: str) -> int:
    """Nanoseconds the clocks were held down under one perf policy since the driver loaded."""
    return int(lib.nvmlDeviceGetViolationStatus(h, getattr(lib, policy)).violationTime)


# nvmlValue_t's member for each nvmlValueType_t (nvml.h): double, uint, ulong, ulonglong,
# slonglong, sint, ushort.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _field(lib: Any, h: Any, name: str) -> int:
    """One NVML field value (nvmlDeviceGetFieldValues), by its NVML_FI_ name; raises where
    the driver does not give it."""
    value = lib.nvmlDeviceGetFieldValues(h, [getattr(lib, name)])[0]
    if value.nvmlReturn != 0:  # NVML_SUCCESS
        raise RuntimeError(f"{name}: NVML error {value.nvmlReturn}")
    return int(getattr(value.value, _VALUE_MEMBERS[value.valueType]))


# Reasons that mean the clock was held down by something other than idling or the app's
# own clock settings (NVML's clocks-event reason bits).
IDLE = 0x1
APPLICATION_CLOCKS = 0x2


def throttled(reasons: int) -> bool:
    """Whether a sample's reasons say the SM clock was held down (power, thermal, ...)."""
    return bool(reasons & ~(IDLE | APPLICATION_CLOCKS))

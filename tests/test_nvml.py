"""krex.core.nvml against a stand-in of pynvml with the real module's names: what a sample holds
where the driver gives each reading, and what it leaves out where it does not."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from krex.core.nvml import Nvml


def fake_pynvml(mem_temp: tuple[int, int, int] | None) -> types.ModuleType:
    """pynvml with one GPU; `mem_temp` is the memory temperature field's (nvmlReturn,
    valueType, value), None for a pynvml without nvmlDeviceGetFieldValues."""
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0  # type: ignore[attr-defined]
    m.NVML_FI_DEV_MEMORY_TEMP = 82  # type: ignore[attr-defined]
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]
    clocks = {1: 1980, 2: 3201}
    m.nvmlDeviceGetClockInfo = lambda h, kind: clocks[kind]  # type: ignore[attr-defined]
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, sensor: 44  # type: ignore[attr-defined]
    if mem_temp is not None:
        ret, kind, value = mem_temp

        def fields(h: Any, ids: list[int]) -> list[Any]:
            assert ids == [82]
            members = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
            union = types.SimpleNamespace(**{name: -1 for name in members})
            setattr(union, members[kind], value)
            return [types.SimpleNamespace(nvmlReturn=ret, valueType=kind, value=union)]

        m.nvmlDeviceGetFieldValues = fields  # type: ignore[attr-defined]
    return m


@pytest.mark.parametrize(
    ("field", "want"),
    [
        ((0, 1, 57), 57),  # NVML_SUCCESS, an unsigned int
        ((0, 5, 58), 58),  # a signed int
        ((3, 1, 0), None),  # NVML_ERROR_NOT_SUPPORTED: left out, the rest kept
        (None, None),  # an older pynvml
    ],
)
def test_a_sample_has_the_memorys_temperature_and_clock_where_the_driver_gives_them(
    monkeypatch: pytest.MonkeyPatch, field: tuple[int, int, int] | None, want: int | None
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(field))
    nvml = Nvml.open()
    assert nvml is not None
    s = nvml.sample(0)
    assert s is not None
    assert s["sm_clock_mhz"] == 1980 and s["mem_clock_mhz"] == 3201 and s["temp_c"] == 44
    assert s.get("mem_temp_c") == want
    assert "energy_mj" not in s  # the stand-in has no energy counter: left out, no error

"""Convolution: conv2d 3x3 (padding 1) + bias + ReLU, batch 256, 128 -> 128 channels, 64 x 64,
fp32 with PyTorch's defaults (cuDNN may use TF32): a kernel of 1.5-2 ms on an H200.

Candidates: eager NCHW, eager channels-last, eager with cuDNN's autotuner
(cudnn.benchmark), and torch.compile.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from krex.bench.tasks._harness import Choice, Variant, kernels_run, run

TASK = "conv"
BATCH, C_IN, C_OUT, HW = 256, 128, 128, 64


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    x = torch.randn(BATCH, C_IN, HW, HW, device="cuda", generator=gen)
    w = torch.randn(C_OUT, C_IN, 3, 3, device="cuda", generator=gen) / (3 * C_IN**0.5)
    b = 0.1 * torch.randn(C_OUT, device="cuda", generator=gen)
    return [x, w, b]


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.relu(F.conv2d(x, w, b, padding=1))


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    x, w, b = (t.double() for t in inputs)
    return _conv(x, w, b)


def _eager(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    x, w, b = inputs
    return lambda: _conv(x, w, b)


def _channels_last(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    x, w, b = inputs
    x = x.to(memory_format=torch.channels_last)
    w = w.to(memory_format=torch.channels_last)
    return lambda: _conv(x, w, b)


def _autotuned(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    torch.backends.cudnn.benchmark = True
    return _eager(inputs)


def _compiled(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    x, w, b = inputs
    f = torch.compile(_conv)
    return lambda: f(x, w, b)


# TF32 (cuDNN's default for convolutions) keeps about 3 significant digits.
_TOL = {"atol": 2e-2, "rtol": 1e-2}
VARIANTS = {
    "eager-nchw": Variant(_eager, **_TOL),
    "eager-channels-last": Variant(_channels_last, **_TOL),
    "cudnn-benchmark": Variant(_autotuned, **_TOL),
    "compiled": Variant(_compiled, **_TOL),
}

# cuDNN's benchmark mode keeps its choice to itself: the report gets the kernels a call runs.
CHOICES: dict[str, Choice] = {"cudnn-benchmark": kernels_run}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS, choices=CHOICES))

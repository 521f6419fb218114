"""cuDNN's benchmark-mode algorithm search in a region (auto-regions: docs/user-guide.md).

With `torch.backends.cudnn.benchmark = True`, the first convolution of each new configuration
(shapes, strides, dtypes, parameters, tf32 and determinism settings) times every cuDNN
algorithm for it and keeps the fastest for the rest of the process. That search runs inside
the convolution call, in C++, with no Python hook: next to busy siblings it times the
candidates under contention and may keep a different algorithm than it would alone (measured:
a conv candidate +6.24 % under krex against +0.01 % for the native repeat, docs/bench.md).

So the convolution entry points are wrapped: while benchmark mode is on, the first call of a
configuration this process has not seen runs in a region, which covers the search; every later
call goes straight through, and so does every call inside a region (a timing loop: the search
is protected there already, and building the key, a few microseconds, would be timed). The
entry points are `torch.nn.functional`'s conv and conv_transpose functions (what `nn.Conv*d`
modules call) and Inductor's `extern_kernels.convolution` (what compiled graphs call for a
convolution). Not `torch.conv2d` and its kin: dynamo knows torch's builtins by what
`torch.<name>` is when it first compiles, so a wrapper there made it treat the real builtin as
unknown, a graph break at every convolution (checked with torch 2.13 on a CPU; the `F`
wrappers cause none). TorchScript compiles a wrapper as the aten op it wraps.

Our key can differ from PyTorch's own cache key (which also looks at pointer alignment): a
configuration it searches again that we have seen runs outside a region. Under torch.compile's
tracing the wrappers are transparent (no graph break).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable
from typing import Any

from krex.tenant.markers import WRAPPED_MARK, auto_region, region_depth

_CONVS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
# What search_region wraps, as attribute paths under `torch`: wrapped once torch's own import is
# complete (torch.backends.cudnn and torch.compiler exist by then), or at once if it is.
TORCH_PATHS = tuple(f"nn.functional.{name}" for name in _CONVS)
# Inductor registers `convolution` in its extern_kernels namespace when this module is
# imported (torch/_inductor/kernel/conv.py: ExternKernelChoice(torch.convolution, ...)).
INDUCTOR_CONV_MODULE = "torch._inductor.kernel.conv"
INDUCTOR_NAMESPACE_MODULE = "torch._inductor.select_algorithm"


def search_region(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fn, with its first call per configuration in a region while cuDNN benchmark mode is on.

    Called once torch is imported; fn itself when torch's parts it needs cannot be found."""
    if getattr(fn, WRAPPED_MARK, False):
        return fn
    try:
        import torch.backends.cudnn as cudnn
        import torch.compiler

        compiling = torch.compiler.is_compiling
    except (ImportError, AttributeError):
        return fn
    seen: set[Hashable] = set()
    label = f"{name} (cuDNN search)"  # the region's name in its record's `calls`

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # First: under dynamo's tracing this folds to True and the trace is just fn's. Then:
        # inside a region (a timing loop) the call is protected already, and the few
        # microseconds of key building would land in the timed interval.
        if compiling() or region_depth() or not (cudnn.benchmark and cudnn.enabled):
            return fn(*args, **kwargs)
        key = _key(name, args, kwargs)
        if key is None or key in seen:
            return fn(*args, **kwargs)
        with auto_region(label, candidate=True):
            out = fn(*args, **kwargs)
        seen.add(key)
        return out

    wrapper.__name__ = getattr(fn, "__name__", name.rsplit(".", 1)[-1])
    wrapper.__qualname__ = wrapper.__name__
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    setattr(wrapper, WRAPPED_MARK, True)
    _as_torchscript_builtin(wrapper, fn)
    return wrapper


def _as_torchscript_builtin(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> None:
    """TorchScript compiles a call of wrapper as it would fn's, the aten op (without a region
    for cuDNN's search: a scripted model's convolutions are not ours to see). Without this,
    `torch.jit.script` of a module calling F.conv2d fails on the Python wrapper."""
    try:
        from torch.jit import _builtins

        op = f"aten::{fn.__name__}"
        if _builtins._builtin_table is None:  # built lazily, from this list among others
            _builtins._builtin_ops.append((wrapper, op))
        else:
            _builtins._register_builtin(wrapper, op)
    except Exception:  # another torch's internals: scripting such a module fails as it would
        pass


def _key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """What decides cuDNN's choice for this call, or None when it is not all on a CUDA device."""
    import torch

    autocast = torch.is_autocast_enabled("cuda")
    parts: list[Any] = [
        name,
        bool(torch.backends.cudnn.allow_tf32),
        bool(torch.backends.cudnn.deterministic),
        torch.get_autocast_dtype("cuda") if autocast else None,
    ]
    cuda = None
    v: Any
    for k, v in (*enumerate(args), *sorted(kwargs.items())):
        if isinstance(v, torch.Tensor):
            cuda = v.is_cuda and cuda is not False
            v = (tuple(v.shape), v.stride(), v.dtype, v.device, v.requires_grad)
        else:
            try:
                hash(v)
            except TypeError:
                v = repr(v)
        parts.append((k, v))
    return tuple(parts) if cuda else None  # None: no tensor, or one off the GPU


# Inductor's extern_kernels is internal: read from torch 2.11 (its source, and on the H200) and
# 2.13 (its generated code calls extern_kernels.convolution; on a CPU). Auto-regions wrap it
# only on these (krex/tenant/autoregions.py).
INDUCTOR_TORCH = ("2.11.", "2.13.")


def wrap_inductor_conv() -> None:
    """Inductor's extern_kernels.convolution wrapped (called by name from compiled graphs)."""
    namespace: Any = getattr(sys.modules.get(INDUCTOR_NAMESPACE_MODULE), "extern_kernels", None)
    fn = getattr(namespace, "convolution", None)
    if callable(fn) and not getattr(fn, WRAPPED_MARK, False):
        namespace.convolution = search_region(
            fn, f"{INDUCTOR_NAMESPACE_MODULE}.extern_kernels.convolution"
        )

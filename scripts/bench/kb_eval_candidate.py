"""One KernelBench eval as one command, for scripts/bench/kb_eval.py.

    python3 kb_eval_candidate.py KB_SRC REFERENCE_FILE CANDIDATE_FILE
        [--correct-trials 5] [--perf-trials 100] [--timing-method cuda_event]

KB_SRC holds KernelBench's `kernelbench` package (its src/), put first on sys.path. What runs is
what KernelBench's scripts/run_and_check.py runs locally, unmodified: `eval_kernel_against_ref`
on the reference's and the candidate's sources (correctness trials, then its timer on the
candidate and, for its excessive-speedup check, on the reference; fp32, backend cuda, cuda:0),
then `measure_ref_program_time` of the reference in eager mode, the same timer and number of
trials; the speedup is that reference time over the candidate's, both means, as run_and_check
prints it (only for a correct candidate). Under `krex run --auto-regions` each of KernelBench's
timers (`kernelbench.timing.time_execution_with_*`) is a region as it is; the correctness
trials are not regions and are not changed.

Prints one JSON line: the verdict (correct, incorrect, not compiled, or error when the eval
raised: run_and_check's last-level catch, recorded as not compiled), KernelBench's runtime,
ref_runtime (eager reference) and eval_ref_runtime (its excessive-speedup check's) in ms as its
get_timing_stats rounds them (3 significant digits), the speedup from those, and `raw`: the
same means from the trials' own times with the speedup from them and the trials themselves
(observed by wrapping `kernelbench.timing.get_timing_stats`, which only reads them, after each
timer returns), and
`stubbed`: the modules served by STUBS. Exit 0 once the line is out; 3 when the eval returned
None (its lock-file case: "please retry"); 1 for an exception of this script; 2 for bad
arguments. Ends with os._exit, as kb_candidate.py does.

`import kernelbench` imports python-dotenv, tqdm, openai and litellm (its utils), its eval
numpy, requests and pydantic; a GPU box with torch only may lack them. A module none of the
importers finds is served from STUBS (a finder appended to sys.meta_path, so asked last): the
names that KernelBench's eval path uses from them, nothing that changes a result (pydantic's
BaseModel there is a plain record of the annotated fields with copied defaults).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kb_candidate import leave  # a script beside this one

T0 = time.monotonic()

# Module name: the source of its stand-in (what KernelBench's eval path names of it).
STUBS = {
    "dotenv": "def load_dotenv(*args, **kwargs):\n    return False\n",
    "tqdm": "def tqdm(iterable=None, *args, **kwargs):\n    return iterable\n",
    "openai": (
        "class OpenAI:\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise ImportError('openai is not installed (a kb_eval stub)')\n"
    ),
    "litellm": (
        "def completion(*args, **kwargs):\n"
        "    raise ImportError('litellm is not installed (a kb_eval stub)')\n"
    ),
    "requests": "",
    "pydantic": '''
import copy


class BaseModel:
    """The annotated fields, from keywords or a copy of the class's default."""

    def __init__(self, **data):
        for klass in reversed(type(self).__mro__):
            for name in getattr(klass, "__annotations__", {}):
                if name in data:
                    setattr(self, name, data[name])
                elif hasattr(type(self), name):
                    setattr(self, name, copy.deepcopy(getattr(type(self), name)))
        for name, value in data.items():
            setattr(self, name, value)

    def model_dump(self):
        return dict(vars(self))

    def __repr__(self):
        fields = " ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"
''',
}


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves STUBS' modules; appended to sys.meta_path, it is asked only when no other finder
    has the module (a real one installed is always the one imported)."""

    def __init__(self) -> None:
        self.served: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in STUBS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__dict__["__kb_eval_stub__"] = True
        exec(STUBS[module.__name__], module.__dict__)
        self.served.append(module.__name__)


def since() -> float:
    return round(time.monotonic() - T0, 3)


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and a > 0 and b > 0 else None


def jsonable(x: Any) -> Any:
    """The metadata as JSON (an exception or a dtype as its text)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


def verdict(compiled: bool, correct: bool) -> str:
    return "correct" if correct else "incorrect" if compiled else "not compiled"


def evaluate(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    sys.path.insert(0, str(Path(args.kb_src).resolve()))
    import torch

    kernel_eval: Any = importlib.import_module("kernelbench.eval")
    timing: Any = importlib.import_module("kernelbench.timing")
    row: dict[str, Any] = {"reference": args.reference, "t_import_s": since()}
    times: list[list[float]] = []  # each get_timing_stats call's trials, in order
    stats = timing.get_timing_stats

    def observed(elapsed_times: list[float], device: Any = None) -> Any:
        times.append([float(t) for t in elapsed_times])
        return stats(elapsed_times, device=device)

    timing.get_timing_stats = observed
    ref_src = Path(args.reference).read_text()
    new_src = Path(args.candidate).read_text()
    device = torch.device("cuda:0")
    with tempfile.TemporaryDirectory(prefix="kb-build-") as build_dir:
        try:  # run_and_check's evaluate_single_sample_src
            result = kernel_eval.eval_kernel_against_ref(
                original_model_src=ref_src,
                custom_model_src=new_src,
                measure_performance=True,
                timing_method=args.timing_method,
                verbose=False,
                num_correct_trials=args.correct_trials,
                num_perf_trials=args.perf_trials,
                build_dir=build_dir,
                device=device,
                backend="cuda",
                precision=torch.float32,
            )
        except Exception as e:
            traceback.print_exc()
            row |= {"verdict": "error", "compiled": False, "correctness": False}
            row["metadata"] = {"other_error": f"error: {e}"}
            return 0, row
    row["t_eval_s"] = since()
    if result is None:
        row["verdict"] = "retry"  # eval_kernel_against_ref's lock-file case
        return 3, row
    timed = bool(result.runtime_stats)  # then its first timing is the candidate's
    new_raw = times[0] if timed else []
    eval_ref_raw = times[1] if timed and len(times) > 1 else times[0] if times else []
    n = len(times)
    ref_stats = timing.measure_ref_program_time(
        ref_arch_name="Reference Program",
        ref_arch_src=ref_src,
        num_trials=args.perf_trials,
        use_torch_compile=False,
        timing_method=args.timing_method,
        device=device,
        verbose=False,
        precision="fp32",
    )
    row["t_ref_s"] = since()
    ref_raw = times[n] if len(times) > n else []
    runtime = result.runtime if result.runtime > 0 else None
    ref_runtime = ref_stats.get("mean") if isinstance(ref_stats, dict) else None
    row |= {
        "verdict": verdict(result.compiled, result.correctness),
        "compiled": result.compiled,
        "correctness": result.correctness,
        "runtime_ms": runtime,
        "ref_runtime_ms": ref_runtime,
        "eval_ref_runtime_ms": result.ref_runtime if result.ref_runtime > 0 else None,
        "speedup": ratio(ref_runtime, runtime) if result.correctness else None,
        "runtime_stats": jsonable(result.runtime_stats),
        "ref_runtime_stats": jsonable(ref_stats),
        "metadata": jsonable(result.metadata),
    }
    new_mean, ref_mean = mean(new_raw), mean(ref_raw)
    row["raw"] = {
        "runtime_ms": new_mean,
        "ref_runtime_ms": ref_mean,
        "eval_ref_runtime_ms": mean(eval_ref_raw),
        "speedup": ratio(ref_mean, new_mean) if result.correctness else None,
        "trials": [len(new_raw), len(ref_raw), len(eval_ref_raw)],
        # Each trial (ms, to the ns): the fastest trials, free of a slow launch on the host,
        # tell the GPU's part of a difference from the host's (KernelBench's min is rounded).
        "trials_ms": {
            "candidate": [round(t, 6) for t in new_raw],
            "eval_reference": [round(t, 6) for t in eval_ref_raw],
            "reference": [round(t, 6) for t in ref_raw],
        },
    }
    row["peak_bytes"] = torch.cuda.max_memory_allocated()
    return 0, row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kb_src", help="the directory that holds KernelBench's kernelbench package")
    ap.add_argument("reference", help="a KernelBench problem file (its Model)")
    ap.add_argument("candidate", help="the candidate's source (its ModelNew)")
    ap.add_argument("--correct-trials", type=int, default=5)
    ap.add_argument("--perf-trials", type=int, default=100)
    ap.add_argument("--timing-method", default="cuda_event")
    args = ap.parse_args(argv[1:])
    stubs = StubFinder()
    sys.meta_path.append(stubs)
    try:
        code, row = evaluate(args)
    except Exception as e:
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"error: {type(e).__name__}: {first}", file=sys.stderr)
        return 1
    row["stubbed"] = sorted(stubs.served)
    row["t_end_s"] = since()
    print(json.dumps(row), flush=True)
    return code


if __name__ == "__main__":
    leave(main(sys.argv))

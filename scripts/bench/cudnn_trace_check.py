"""The cuDNN auto-region wrappers under torch's tracers, on any machine with torch (CPU is
enough): graph breaks and graphs of torch.compile (dynamo's explain and counters) for a conv
function and an nn.Conv2d module, natively and with `krex.tenant.autoregions.install()`; and whether
torch.jit.script, torch.fx.symbolic_trace and torch.export still take a module calling
F.conv2d. Prints one JSON line per mode.

    python scripts/bench/cudnn_trace_check.py          (needs torch; no GPU)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import torch, torch.nn.functional as F
if sys.argv[1] == "auto":
    sys.path.insert(0, sys.argv[2])
    import krex.tenant.autoregions as a
    a.install(a.DEFAULT_AUTO_REGIONS)
torch.backends.cudnn.benchmark = True
x, w, b = torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3), torch.randn(4)
fn = lambda x, w, b: F.relu(F.conv2d(x, w, b, padding=1))
out = {"mode": sys.argv[1], "torch": torch.__version__,
       "wrapped": hasattr(F.conv2d, "__krex_region__")}
e = torch._dynamo.explain(fn)(x, w, b)
out["fn_graphs"], out["fn_breaks"] = e.graph_count, e.graph_break_count
m = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.ReLU())
e = torch._dynamo.explain(m)(x)
out["module_graphs"], out["module_breaks"] = e.graph_count, e.graph_break_count
torch._dynamo.reset()
out["compiled_matches_eager"] = bool(torch.allclose(torch.compile(m)(x), m(x), atol=1e-5))


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4, 3, 3))

    def forward(self, x):
        return F.conv2d(x, self.w, padding=1)


for name, make in (("jit_script", lambda: torch.jit.script(M())(x)),
                   ("fx_trace", lambda: torch.fx.symbolic_trace(M())(x)),
                   ("export", lambda: torch.export.export(M(), (x,)))):
    try:
        make()
        out[name] = "ok"
    except Exception as exc:
        out[name] = repr(exc)[:200]
print(json.dumps(out))
"""

with tempfile.TemporaryDirectory() as d:
    script = Path(d) / "probe.py"  # a file: TorchScript reads the module's source
    script.write_text(PROBE)
    for mode in ("native", "auto"):
        p = subprocess.run([sys.executable, str(script), mode, str(ROOT)], capture_output=True,
                           text=True, timeout=600)  # fmt: skip
        lines = p.stdout.strip().splitlines()
        print(lines[-1] if lines else json.dumps({"mode": mode, "error": p.stderr[-1000:]}))

#!/usr/bin/env bash
# The README's real-GPU path, as written: its "On an NVIDIA GPU" block is extracted from README.md
# and run line by line in an empty directory, then the same bench.py four at once through
# `krex run` (each region must be clean). Expects krex importable and `krex` on PATH
# (scripts/gpu_check.sh installs it editable when it is not). Writes $OUT/readme/.
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-$PWD/gpu-out}/readme
mkdir -p "$out"
work=$(mktemp -d)
awk '/^On an NVIDIA GPU/{f=1} f&&/^```sh/{g=1;next} g&&/^```/{exit} g' "$top/README.md" >"$out/block.sh"
echo "== the README's block ($(wc -l <"$out/block.sh") lines)"
(cd "$work" && bash -ex "$out/block.sh") 2>&1 | tee "$out/block.log"
rc=${PIPESTATUS[0]}
cp "$work/r.json" "$out/r.json" 2>/dev/null
echo "== four at once"
pids=()
for i in 1 2 3 4; do
    (cd "$work" && krex run --report "r$i.json" -- python bench.py >"$work/four-$i.log" 2>&1) &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || rc=1; done
cat "$work"/four-*.log >"$out/four.log"
python3 - "$work" <<'PY' | tee "$out/four.txt"
import json, sys, pathlib
for i in range(1, 5):
    r = json.loads(pathlib.Path(sys.argv[1], f"r{i}.json").read_text())
    print(i, r["exit_code"], r["pool"], [(g["clean"], round(g["duration_s"], 3), g["problems"], [w["name"] for w in g.get("warnings", [])]) for g in r["regions"]])
PY
krex daemon stop || rc=1
exit "$rc"

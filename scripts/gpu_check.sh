#!/usr/bin/env bash
# The foundation's GPU check (make gpu-check): builds KREX on the GPU machine and runs real CUDA
# programs under the preload library. Logs and results go to $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
echo "== krex gpu-check $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
nvidia-smi -L || { echo "no NVIDIA GPU here"; exit 2; }
# cffi and posix_ipc are not installed on the GPU box: carried as wheels in .whl/ when needed.
if ! python3 -c 'import cffi, posix_ipc' 2>/dev/null && [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/krex-site .whl/*.whl
    export PYTHONPATH=/tmp/krex-site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 setup.py -q build_ext --inplace || { echo "build failed"; exit 1; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
BUILD=$(mktemp -d)
nvcc -ptx -arch=sm_90 -o "$BUILD/kernels.ptx" scripts/gpu/kernels.cu || exit 1
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
gcc -O2 -o "$BUILD/launch_overhead" scripts/gpu/launch_overhead.c -I"$CUDA_HOME/include" -lcuda \
    -L/usr/local/nvidia/lib64 -L/usr/lib/x86_64-linux-gnu || exit 1
# PARTS picks sections: shim overhead controller mps demo (the default: all of these), and the
# longer ones asked for by name: suite (every candidate of the real-GPU suite checked and timed),
# pool (scripts/bench/pool_check.py: the warm pool against cold commands), readme (the README's
# real-GPU block as written), security (scripts/gpu/security_check.py), fidelity
# (scripts/bench/fidelity_check.py; FIDELITY_PHASES), fidelity-probe (PROBE_PARTS) and
# pool-probe (scripts/bench/fidelity_probe.py, pool_probe.py), warm (warm_check.py), probes
# (scripts/gpu/warm_native_check.py: issue #48's probe catalogue; PROBES_ONLY picks probes),
# tunableop (scripts/gpu/tunableop_check.py: the TunableOp warning, warm and cold), linger
# (scripts/gpu/linger_check.py: a timing right after Triton's autotune gets its own region;
# LINGER_SIBLINGS=N: the suite's 8192^3 matmul beside N bursty siblings), settle
# (scripts/gpu/settle_check.py: the settle step's trigger, time-sliced and under MPS),
# gapsettle (scripts/bench/gap_settle.py: the capped settle's gap rule, natively; GAP_SETTLE_ARGS),
# autotune (scripts/bench/autotune_check.py; AUTOTUNE_REPEATS, AUTOTUNE_FIRST_REPEAT (a run
# split over calls keeps its rotation), AUTOTUNE_SIBLINGS, AUTOTUNE_PARTS,
# AUTOTUNE_SHARING=mps, AUTOTUNE_LINGER, AUTOTUNE_ALONE=1 adds krex with no siblings
# (AUTOTUNE_ALONE_EACH=1: in every repeat),
# AUTOTUNE_HELD=1 natively beside idle memory holders, AUTOTUNE_FROZEN=1 natively beside
# siblings stopped over each timing, AUTOTUNE_COOLED=1 the same after 3 s of cooling,
# AUTOTUNE_SETTLED=S krex with each timing's region idle S seconds first,
# AUTOTUNE_REGION_SETTLE=S krex run --settle S (the daemon's settle step),
# AUTOTUNE_PINNED=CPUS natively alone on those CPUs (a region's cores),
# AUTOTUNE_SAMPLE_MS, AUTOTUNE_NO_UNPROTECTED=1, AUTOTUNE_ROTATE=1, AUTOTUNE_SLICE=REGION/SHARED,
# AUTOTUNE_KB_TIMING=PATH: KernelBench's own src/kernelbench/timing.py, AUTOTUNE_POOL_READY=1:
# inductor_kb9 compiles once Inductor's compile workers are up), launch-probe
# (scripts/bench/launch_probe.py; AUTOTUNE_SLICE too), preload-probe
# (scripts/gpu/preload_probe.py), SECURITY_CASES picks security's,
# bench (krex bench run: BENCH_PROFILE, default quick; BENCH_CONCURRENCY, default 8;
# BENCH_TASKS, default all; BENCH_MODES, default exclusive,shared,krex; BENCH_SETTLE, the
# krex-settle mode's seconds),
# memory (scripts/bench/memory_check.py: the memory-heavy mix on one GPU; MEMORY_MODES, default
# exclusive,shared8,krex8,krex16; shared8-mps, krex8-mps and krex16-mps go through MPS),
# mgpu-native and mgpu-krex (scripts/bench/multi_gpu.py on a node of two GPUs: the native
# baselines on both GPUs, then krex over both; mgpu-krex reads MGPU_NATIVE, the first's
# native.json; MGPU_TASKS picks tasks), mgpu-memory (scripts/bench/memory_check.py --gpus 2:
# the memory-heavy mix on both GPUs at once; MGPU_MEMORY_MODES, default exclusive,shared8,krex8),
# kbmem (scripts/bench/kb_memory.py: 16 KernelBench problems eager and compiled, from .kb/problems
# (KB_PROBLEMS), carried with the tree; KB_MODES, default exclusive,krex8,krex16; KB_BUDGET_S,
# default what is left of 575 s since this script started; KB_SUBSET=N: the first N problems;
# KB_BASELINE: an earlier run's JSON for exclusive and exclusive2), kbeval
# (scripts/bench/kb_eval.py: KernelBench's own eval of 24 candidates from .kb/eval (KB_EVAL_DIR,
# made by kb_eval.py --populate); KB_EVAL_MODES, default exclusive,krex8,exclusive2, any of
# kb_memory.py's modes (krex1, krex1-cold, krex1-allcores: one at a time through krex;
# krex8-allcores: krex8 with the region's owner not pinned; exclusive-nvml and exclusive-churn:
# natively beside the daemon's NVML reads, beside device memory held and churned);
# KB_EVAL_BUDGET_S, default what is left of 555 s since this script started; KB_EVAL_SUBSET=N;
# KB_EVAL_BASELINE: an earlier run's JSON for exclusive and exclusive2), timers
# (scripts/bench/timers_check.py: each timer auto-regions cover, alone, under krex beside 7 busy
# siblings and alone again; TIMERS_LIST, default every one measurable there; TIMERS_KB_TIMING:
# KernelBench's timing.py, default .kb/eval/src/kernelbench/timing.py where it exists;
# TIMERS_BUDGET_S, default what is left of 555 s since this script started), drvoom
# (scripts/gpu/driver_oom_check.py: a command's first CUDA work beside a full GPU, natively and
# under krex), entry (scripts/bench/region_entry.py: region overhead by sibling kind; ENTRY_KINDS,
# default idle,launching,compiling,memwait; ENTRY_SIBLINGS, default 7; ENTRY_REGIONS, default 30;
# ENTRY_FREEZE, the daemon's regions.freeze, default all; all,contexts runs each kind under both;
# ENTRY_PACE, the daemon's regions.pace_ms, default 0 (off); 0,5 runs each kind under both),
# placement (scripts/bench/placement_probe.py: KernelBench's reference timing again and again in
# one process, natively, beside churned memory, with empty_cache a no-op, through krex 8 at once;
# PLACEMENT_MODES, default alone,churn,churn-hold,krex8,krex8-hold; PLACEMENT_ROUNDS, default 6;
# PLACEMENT_SUBSET; PLACEMENT_BUDGET_S, default what is left of 555 s since this script started).
# checkpoint (scripts/gpu/checkpoint_probe.py: the driver's checkpoint API on a torch process,
# its device memory to host and back, the process kept; CHECKPOINT_GIB, default 8;
# CHECKPOINT_CASES, default sleeping,busy; krex-wait: a command waiting in krex's memory wait;
# krex-deadlock: a memory deadlock krex breaks by a swap; krex-deadlock2: the same, the swapped
# command of two processes),
# simmem (scripts/bench/sim_memory.py: the simulated GPU's memory mix, no GPU used, on this
# machine's cores: SIMMEM_PAIRS pairs of krex16 and krex8, default 4, alternating which runs first).
# NCCL_NVLS_ENABLE=0 as the device's KINDS.md asks.
PARTS=${PARTS:-"shim overhead controller mps demo"}
rc=0
if [[ " $PARTS " == *" shim "* ]]; then
    echo "== the shim under PyTorch, Triton, CuPy, cuda-python; launch cost; the gate"
    python3 scripts/gpu/check.py --out "$OUT" --ptx "$BUILD/kernels.ptx" \
        --overhead-bin "$BUILD/launch_overhead" || rc=1
fi
if [[ " $PARTS " == *" overhead "* ]]; then
    echo "== shim cost per call against a null driver (this machine's CPU)"
    python3 scripts/bench/shim_overhead.py --json "$OUT/shim_overhead.json" || rc=1
fi
if [[ " $PARTS " == *" controller "* ]]; then
    echo "== the controller: fidelity next to 7 busy siblings, auto-regions, grant latency"
    python3 scripts/gpu/controller_check.py --out "$OUT" || rc=1
fi
if [[ " $PARTS " == *" mps "* ]]; then
    echo "== the controller with MPS on (its own control daemon)"
    python3 scripts/gpu/mps_check.py --out "$OUT" || rc=1
fi
if [[ " $PARTS " == *" settle "* ]]; then
    echo "== the settle step's trigger, time-sliced and under MPS (scripts/gpu/settle_check.py)"
    python3 scripts/gpu/settle_check.py --out "$OUT" || rc=1
fi
if [[ " $PARTS " == *" gapsettle "* ]]; then
    echo "== the capped settle's gap rule, natively: own capped work, siblings' gap, idle (gap_settle.py)"
    python3 scripts/bench/gap_settle.py --out "$OUT/gap_settle.jsonl" ${GAP_SETTLE_ARGS:-} || rc=1
fi
if [[ " $PARTS " == *" linger "* ]]; then
    echo "== a timing right after Triton's autotune: its own region (scripts/gpu/linger_check.py)"
    python3 scripts/gpu/linger_check.py --out "$OUT" --siblings "${LINGER_SIBLINGS:-0}" || rc=1
fi
if [[ " $PARTS " == *" tunableop "* ]]; then
    echo "== PyTorch TunableOp under auto-regions: its one warning, warm and cold"
    python3 scripts/gpu/tunableop_check.py --out "$OUT" || rc=1
fi
if [[ " $PARTS " == *" demo "* ]]; then
    echo "== krex demo on the GPU (python3 -m krex.cli demo --gpu)"
    python3 -m krex.cli demo --gpu || rc=1
fi
if [[ " $PARTS " == *" suite "* ]]; then
    echo "== the real-GPU bench suite: every candidate checked and timed"
    python3 scripts/bench/suite_check.py --json "$OUT/suite_check.json" || rc=1
fi
if [[ " $PARTS " == *" readme "* ]]; then
    echo "== the README's real-GPU path, as written (scripts/gpu/readme_check.sh)"
    if ! command -v krex >/dev/null; then  # no registry there: an editable install, offline
        python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip-install.log" 2>&1
        command -v krex >/dev/null || export PATH=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH
    fi
    OUT=$OUT bash scripts/gpu/readme_check.sh || rc=1
fi
if [[ " $PARTS " == *" security "* ]]; then
    echo "== regions beside ungated work: dlmopen, no shim, a late foreign process, RTLD_DEEPBIND; 8 normal slots"
    CUDA_LIBS=(-L/usr/local/nvidia/lib64 -L/usr/lib/x86_64-linux-gnu -lcuda -ldl)
    gcc -O2 -o "$BUILD/dlmopen_sibling" scripts/gpu/dlmopen_sibling.c -I"$CUDA_HOME/include" -ldl &&
        gcc -O2 -shared -fPIC -o "$BUILD/libdeepbind.so" scripts/gpu/deepbind_lib.c \
            -I"$CUDA_HOME/include" "${CUDA_LIBS[@]}" &&
        gcc -O2 -o "$BUILD/deepbind_sibling" scripts/gpu/deepbind_sibling.c \
            -I"$CUDA_HOME/include" "${CUDA_LIBS[@]}" &&
        python3 scripts/gpu/security_check.py --out "$OUT/security" \
            --dlmopen-bin "$BUILD/dlmopen_sibling" --ptx "$BUILD/kernels.ptx" \
            --deepbind-bin "$BUILD/deepbind_sibling" --deepbind-lib "$BUILD/libdeepbind.so" \
            --cases "${SECURITY_CASES:-normal,dlmopen,noshim,late,deepbind,deepbind-nested}" || rc=1
fi
if [[ " $PARTS " == *" fidelity "* ]]; then
    echo "== kernels exclusive twice, then under krex beside 7 siblings holding 98 GiB (bw_candidate.py)"
    python3 scripts/bench/fidelity_check.py --json "$OUT/fidelity_check.json" \
        --phases "${FIDELITY_PHASES:-exclusive,alone,churn,idle}" \
        --kinds "${FIDELITY_KINDS:-matvec,reduce,elementwise,matmul}" || rc=1
fi
if [[ " $PARTS " == *" fidelity-probe "* ]]; then
    echo "== what makes a process's later measurement differ (scripts/bench/fidelity_probe.py)"
    python3 scripts/bench/fidelity_probe.py --json "$OUT/fidelity_probe.json" \
        --parts "${PROBE_PARTS:-matmul,recovery,matvec}" || rc=1
fi
if [[ " $PARTS " == *" pool-probe "* ]]; then
    echo "== a compile command's teardown; fork-server start cost (scripts/bench/pool_probe.py)"
    python3 scripts/bench/pool_probe.py --json "$OUT/pool_probe.json" --log "$OUT/pool_probe.log" || rc=1
fi
if [[ " $PARTS " == *" launch-probe "* ]]; then
    echo "== a launch's CPU time per set of cores, natively and in krex regions (launch_probe.py)"
    python3 scripts/bench/launch_probe.py --json "$OUT/launch_probe.json" \
        ${AUTOTUNE_SLICE:+--slice "$AUTOTUNE_SLICE"} || rc=1
fi
if [[ " $PARTS " == *" preload-probe "* ]]; then
    echo "== does importing Inductor's compiler initialise the driver (scripts/gpu/preload_probe.py)"
    python3 scripts/gpu/preload_probe.py | tee "$OUT/preload_probe.jsonl" || rc=1
fi
if [[ " $PARTS " == *" autotune "* ]]; then
    echo "== autotuners' winners and harness timers: exclusive, unprotected and krex beside 7 siblings"
    python3 scripts/bench/autotune_check.py --json "$OUT/autotune_check.json" \
        --repeats "${AUTOTUNE_REPEATS:-2}" --first-repeat "${AUTOTUNE_FIRST_REPEAT:-0}" \
        --siblings "${AUTOTUNE_SIBLINGS:-steady}" \
        ${AUTOTUNE_ALONE:+--alone} ${AUTOTUNE_ALONE_EACH:+--alone-each} \
        ${AUTOTUNE_PARTS:+--parts "$AUTOTUNE_PARTS"} \
        ${AUTOTUNE_SHARING:+--sharing "$AUTOTUNE_SHARING"} ${AUTOTUNE_HELD:+--held} \
        ${AUTOTUNE_LINGER:+--linger "$AUTOTUNE_LINGER"} ${AUTOTUNE_FROZEN:+--frozen} \
        ${AUTOTUNE_COOLED:+--cooled} ${AUTOTUNE_SETTLED:+--settled "$AUTOTUNE_SETTLED"} \
        ${AUTOTUNE_REGION_SETTLE:+--region-settle "$AUTOTUNE_REGION_SETTLE"} \
        ${AUTOTUNE_SAMPLE_MS:+--sample-ms "$AUTOTUNE_SAMPLE_MS"} \
        ${AUTOTUNE_NO_UNPROTECTED:+--no-unprotected} ${AUTOTUNE_ROTATE:+--rotate} \
        ${AUTOTUNE_SLICE:+--slice "$AUTOTUNE_SLICE"} \
        ${AUTOTUNE_PINNED:+--pinned "$AUTOTUNE_PINNED"} \
        ${AUTOTUNE_KB_TIMING:+--kernelbench-timing "$AUTOTUNE_KB_TIMING"} \
        ${AUTOTUNE_POOL_READY:+--pool-ready} || rc=1
fi
if [[ " $PARTS " == *" warm "* ]]; then
    echo "== the fork-server pool: preloads, a compute-bound kernel warm vs exclusive, walls"
    python3 scripts/bench/warm_check.py --json "$OUT/warm_check.json" || rc=1
fi
if [[ " $PARTS " == *" probes "* ]]; then
    echo "== a warm command is the command: the probe catalogue natively, cold and warm (torch too)"
    python3 scripts/gpu/warm_native_check.py --out "$OUT/probes" ${PROBES_ONLY:+--only "$PROBES_ONLY"} || rc=1
fi
if [[ " $PARTS " == *" pool "* ]]; then
    echo "== the warm pool: a typical command cold vs warm; 32 commands at 8 slots"
    python3 scripts/bench/pool_check.py --json "$OUT/pool_check.json" || rc=1
fi
export NCCL_NVLS_ENABLE=0
mgpu_tasks=()
[ -n "${MGPU_TASKS:-}" ] && mgpu_tasks=(--tasks "$MGPU_TASKS")
if [[ " $PARTS " == *" mgpu-native "* ]]; then
    echo "== two GPUs: the suite one command at a time on each GPU, twice (no krex)"
    python3 scripts/bench/multi_gpu.py native --out "$OUT/mgpu" "${mgpu_tasks[@]}" || rc=1
fi
if [[ " $PARTS " == *" mgpu-krex "* ]]; then
    echo "== two GPUs through krex: GPU 1 alone, then both GPUs at once, 8 commands each"
    python3 scripts/bench/multi_gpu.py krex --out "$OUT/mgpu" --native "${MGPU_NATIVE:?}" \
        "${mgpu_tasks[@]}" || rc=1
fi
if [[ " $PARTS " == *" memory "* ]]; then
    echo "== device memory: the memory-heavy mix ${MEMORY_MODES:-exclusive,shared8,krex8,krex16}"
    python3 scripts/bench/memory_check.py --json "$OUT/memory_check.json" \
        --modes "${MEMORY_MODES:-exclusive,shared8,krex8,krex16}" || rc=1
fi
if [[ " $PARTS " == *" drvoom "* ]]; then
    echo "== the driver's own out-of-memory: a command's first CUDA work beside a full GPU"
    python3 scripts/gpu/driver_oom_check.py --json "$OUT/driver_oom.json" || rc=1
fi
if [[ " $PARTS " == *" kbmem "* ]]; then
    echo "== KernelBench problems where memory binds: ${KB_MODES:-exclusive,krex8,krex16} (kb_memory.py)"
    python3 scripts/bench/kb_memory.py --problems "${KB_PROBLEMS:-.kb/problems}" \
        --json "$OUT/kb_memory.json" --modes "${KB_MODES:-exclusive,krex8,krex16}" \
        --budget-s "${KB_BUDGET_S:-$((575 - SECONDS))}" ${KB_SUBSET:+--subset "$KB_SUBSET"} \
        ${KB_BASELINE:+--baseline "$KB_BASELINE"} || rc=1
fi
if [[ " $PARTS " == *" entry "* ]]; then
    echo "== region overhead by sibling kind: ${ENTRY_KINDS:-idle,launching,compiling,memwait}" \
        "(regions.freeze ${ENTRY_FREEZE:-all}, regions.pace_ms ${ENTRY_PACE:-0})"
    python3 scripts/bench/region_entry.py --json "$OUT/region_entry.json" \
        --kinds "${ENTRY_KINDS:-idle,launching,compiling,memwait}" \
        --siblings "${ENTRY_SIBLINGS:-7}" --regions "${ENTRY_REGIONS:-30}" \
        --freeze "${ENTRY_FREEZE:-all}" --pace-ms "${ENTRY_PACE:-0}" || rc=1
fi
if [[ " $PARTS " == *" kbeval "* ]]; then
    echo "== KernelBench's eval: ${KB_EVAL_MODES:-exclusive,krex8,exclusive2} (kb_eval.py)"
    python3 scripts/bench/kb_eval.py --kb "${KB_EVAL_DIR:-.kb/eval}" --json "$OUT/kb_eval.json" \
        --modes "${KB_EVAL_MODES:-exclusive,krex8,exclusive2}" \
        --budget-s "${KB_EVAL_BUDGET_S:-$((555 - SECONDS))}" \
        ${KB_EVAL_SUBSET:+--subset "$KB_EVAL_SUBSET"} \
        ${KB_EVAL_BASELINE:+--baseline "$KB_EVAL_BASELINE"} || rc=1
fi
if [[ " $PARTS " == *" placement "* ]]; then
    echo "== placement: ${PLACEMENT_MODES:-alone,churn,churn-hold,krex8,krex8-hold} (placement_probe.py)"
    python3 scripts/bench/placement_probe.py --kb "${KB_EVAL_DIR:-.kb/eval}" \
        --json "$OUT/placement.json" \
        --modes "${PLACEMENT_MODES:-alone,churn,churn-hold,krex8,krex8-hold}" \
        --rounds "${PLACEMENT_ROUNDS:-6}" ${PLACEMENT_SUBSET:+--subset "$PLACEMENT_SUBSET"} \
        --budget-s "${PLACEMENT_BUDGET_S:-$((555 - SECONDS))}" || rc=1
fi
if [[ " $PARTS " == *" timers "* ]]; then
    echo "== timers: ${TIMERS_LIST:-every one measurable} alone, krex beside 7 siblings, alone again"
    python3 scripts/bench/timers_check.py --json "$OUT/timers_check.json" \
        --budget-s "${TIMERS_BUDGET_S:-$((555 - SECONDS))}" \
        ${TIMERS_LIST:+--timers "$TIMERS_LIST"} \
        ${TIMERS_KB_TIMING:+--kernelbench-timing "$TIMERS_KB_TIMING"} || rc=1
fi
if [[ " $PARTS " == *" checkpoint "* ]]; then
    echo "== the driver's checkpoint API on a torch process (checkpoint_probe.py)"
    python3 scripts/gpu/checkpoint_probe.py --json "$OUT/checkpoint_probe.json" \
        --gib "${CHECKPOINT_GIB:-8}" --cases "${CHECKPOINT_CASES:-sleeping,busy}" || rc=1
fi
if [[ " $PARTS " == *" simmem "* ]]; then
    echo "== the simulated GPU's memory mix on $(nproc) cores: ${SIMMEM_PAIRS:-4} pairs of krex16, krex8"
    mkdir -p "$OUT/simmem"
    for i in $(seq 1 "${SIMMEM_PAIRS:-4}"); do
        if (( i % 2 )); then modes=krex16,krex8; else modes=krex8,krex16; fi
        python3 scripts/bench/sim_memory.py --json "$OUT/simmem/run$i.json" --modes "$modes" \
            > "$OUT/simmem/run$i.txt" 2>&1 || rc=1
        tail -3 "$OUT/simmem/run$i.txt"
    done
fi
if [[ " $PARTS " == *" mgpu-memory "* ]]; then
    echo "== two GPUs: device memory, the mix on each GPU at once"
    mkdir -p "$OUT/mgpu"
    python3 scripts/bench/memory_check.py --json "$OUT/mgpu/memory_check.json" --gpus 2 \
        --modes "${MGPU_MEMORY_MODES:-exclusive,shared8,krex8}" || rc=1
fi
if [[ " $PARTS " == *" bench "* ]]; then
    args=(--profile "${BENCH_PROFILE:-quick}" --concurrency "${BENCH_CONCURRENCY:-8}"
          --modes "${BENCH_MODES:-exclusive,shared,krex}" --out "$OUT/bench")
    [ -n "${BENCH_TASKS:-}" ] && args+=(--tasks "$BENCH_TASKS")
    [ -n "${BENCH_SETTLE:-}" ] && args+=(--settle "$BENCH_SETTLE")
    echo "== krex bench run ${args[*]}"
    python3 -m krex.cli bench run "${args[@]}" || rc=1
fi
exit $rc

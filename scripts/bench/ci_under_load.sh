#!/usr/bin/env bash
# CI as it runs on a busy machine (issue #49): RUNS consecutive `bash .ci/run` in fresh clones of
# one commit, with HOGS CPU-burning processes beside them the whole time. One line per run
# (exit status, wall time, pytest's summary) in OUT/summary.txt, each run's log beside it.
#
#   bash scripts/bench/ci_under_load.sh [REPO] [OUT]    (RUNS=5 HOGS=2 COMMIT=HEAD by default)
set -u
REPO=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
OUT=${2:-/tmp/krex-ci-under-load}
RUNS=${RUNS:-5}
HOGS=${HOGS:-2}
COMMIT=$(git -C "$REPO" rev-parse "${COMMIT:-HEAD}")
mkdir -p "$OUT"
echo "commit $COMMIT, $RUNS runs, $HOGS CPU hogs, $(nproc) CPUs, started $(date -u +%FT%TZ)" \
    > "$OUT/summary.txt"
hogs=()
for _ in $(seq "$HOGS"); do
    python3 -c 'while 1: pass' &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
for i in $(seq "$RUNS"); do
    clone="$OUT/clone"
    rm -rf "$clone" && git clone -q "$REPO" "$clone" && git -C "$clone" checkout -q "$COMMIT"
    t0=$(date +%s)
    (cd "$clone" && CI=true bash .ci/run) > "$OUT/run$i.log" 2>&1
    rc=$?
    t1=$(date +%s)
    result=$(grep -E '(passed|failed).* in [0-9.]+s' "$OUT/run$i.log" | tail -1)
    echo "run $i: rc $rc, wall $((t1 - t0)) s, ended $(date -u +%FT%TZ), $result" >> "$OUT/summary.txt"
done
rm -rf "$OUT/clone"

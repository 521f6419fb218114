#!/bin/bash
# The before/after rounds of README.md, as run (2026-12-06, tenth session): ROUNDS rounds, each
# running scripts/bench/sim_memory.py in the "before" work tree (/tmp/base: `git worktree add
# /tmp/base 2b468a0`, krex/_native.abi3.so and krex/_lib copied from a built checkout, and this
# commit's sim_memory.py) and in the "after" one (/work/main), which first alternating by round.
# Usage: ab.sh ROUNDS OUTDIR "sim_memory.py OPTIONS"
for i in $(seq 1 $1); do
  if [ $((i % 2)) = 0 ]; then trees="/work/main /tmp/base"; else trees="/tmp/base /work/main"; fi
  for tree in $trees; do
    n=$([ $tree = /tmp/base ] && echo before || echo after)
    mkdir -p $2/$n-$i
    (cd $tree && /work/main/.venv/bin/python scripts/bench/sim_memory.py $3 --json $2/$n-$i/x.json > $2/$n-$i/log 2>&1)
  done
done
echo done

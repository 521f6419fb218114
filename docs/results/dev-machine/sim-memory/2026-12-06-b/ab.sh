#!/bin/bash
# The before/after rounds of README.md, section 2, as run (2026-12-06 03:18 UTC): ROUNDS rounds,
# each running scripts/bench/sim_memory.py in the "before" work tree (/tmp/base: `git worktree
# add /tmp/base 7e116af`, with krex/_native.abi3.so and krex/_lib copied from a built checkout,
# and 4828f8e's sim_memory.py) and then in the "after" one (/work/main at 4828f8e), the modes'
# order alternating by round. Usage: ab.sh ROUNDS "EXTRA sim_memory.py OPTIONS"
cd /tmp
for i in $(seq 1 $1); do
  for tree in /tmp/base /work/main; do
    n=$(basename $tree)
    o=$([ $((i%2)) = 0 ] && echo krex8,krex16 || echo krex16,krex8)
    mkdir -p /tmp/ab3/$n-$i
    (cd $tree && /work/main/.venv/bin/python scripts/bench/sim_memory.py --modes $o $2 --json /tmp/ab3/$n-$i/x.json > /tmp/ab3/$n-$i/log 2>&1)
  done
done
echo done

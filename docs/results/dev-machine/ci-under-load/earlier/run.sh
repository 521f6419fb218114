#!/usr/bin/env bash
# Five consecutive `bash .ci/run` in fresh clones of main, two CPU hogs beside them.
set -u
COMMIT=$(git -C /work/main rev-parse HEAD)
echo "commit $COMMIT" > /tmp/ci5/summary.txt
python3 -c 'while 1: pass' & H1=$!
python3 -c 'while 1: pass' & H2=$!
for i in 1 2 3 4 5; do
  rm -rf /tmp/ci5/clone && git clone -q /work/main /tmp/ci5/clone && git -C /tmp/ci5/clone checkout -q $COMMIT
  t0=$(date +%s)
  (cd /tmp/ci5/clone && CI=true bash .ci/run) > /tmp/ci5/run$i.log 2>&1
  rc=$?
  t1=$(date +%s)
  echo "run $i: rc $rc, wall $((t1-t0)) s, $(date -u +%FT%TZ), $(grep -E '^[0-9]+ (passed|failed)|passed|failed' /tmp/ci5/run$i.log | tail -1)" >> /tmp/ci5/summary.txt
done
kill $H1 $H2
echo done >> /tmp/ci5/summary.txt

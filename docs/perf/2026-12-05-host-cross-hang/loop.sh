#!/bin/bash
# Runs the cross-host test binary repeatedly; keeps the log of any failing run.
# CCH: the debug collectives_cross_host test binary (cargo test --test collectives_cross_host --no-run); OUT: a folder for the logs
cd "$(dirname "$0")/../../.."
i=100
while [ ! -f $OUT/stop ]; do
  i=$((i+1))
  s=$(date +%s)
  MSCCLPP_LAUNCH_STACKS=1 "$CCH" > $OUT/run.log 2>&1
  rc=$?
  e=$(date +%s)
  echo "run $i rc=$rc $((e-s))s" >> $OUT/summary
  if [ $rc -ne 0 ]; then cp $OUT/run.log $OUT/fail-$i.log; fi
done

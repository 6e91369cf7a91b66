#!/bin/bash
# builds: /tmp/s11/tandem-old = c6bfe1f (before this work), /tmp/s11/tandem-new2 = 635c8b8 (realized + bursts + hysteresis)
cd /work/main
B="bench -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --depths 2,4,auto --runs 1"
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="old new2"; else order="new2 old"; fi
  for v in $order; do
    echo "round $r $v $(date +%T)" >> /tmp/s11/ab2.log
    /tmp/s11/tandem-$v $B --out /tmp/s11/ab2-$v-$r > /tmp/s11/ab2-$v-$r.log 2>&1
  done
done
echo done > /tmp/s11/ab2.done

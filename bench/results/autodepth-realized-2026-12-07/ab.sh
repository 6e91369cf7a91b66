#!/bin/bash
# builds (copied there first): build/load-ab/tandem-old = c6bfe1f (before this work), build/load-ab/tandem-new2 = 635c8b8 (realized + bursts + hysteresis)
cd "$(dirname "$0")/../../.."
mkdir -p build/load-ab
B="bench -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --depths 2,4,auto --runs 1"
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then order="old new2"; else order="new2 old"; fi
  for v in $order; do
    echo "round $r $v $(date +%T)" >> build/load-ab/ab2.log
    build/load-ab/tandem-$v $B --out build/load-ab/ab2-$v-$r > build/load-ab/ab2-$v-$r.log 2>&1
  done
done
echo done > build/load-ab/ab2.done

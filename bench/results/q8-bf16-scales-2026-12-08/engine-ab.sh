#!/bin/bash
# Old (F32 q8 scales) and new (BF16) tandem binaries, alternating, on the same model:
# `tandem kernels` decode tokens/s and verify t(k+1)/t(1), AVX2 forced, 2 threads.
# usage (repository root): OLD=path NEW=path ROUNDS=6 PREC=int8 bench/results/q8-bf16-scales-2026-12-08/engine-ab.sh
OLD=${OLD:?} NEW=${NEW:?} ROUNDS=${ROUNDS:-6} PREC=${PREC:-int8} MODEL=${MODEL:-build/rand27b-mtp}
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    bin=$OLD; [ $v = new ] && bin=$NEW
    out=$($bin kernels -m $MODEL --quantize q8 --precision $PREC --isa avx2 -t 2 --prefill 0 --max-k 4 --mm-mb 0 --reps 9 2>&1)
    dec=$(echo "$out" | grep "^decode" | sed 's/decode (depth 0): //')
    ver=$(echo "$out" | grep "^| [1-4] |" | awk -F'|' '{printf "%s/%s ", $4, $5}')
    echo "round $r $v :: $dec :: verify ms/ratio k=1..4: $ver"
  done
done

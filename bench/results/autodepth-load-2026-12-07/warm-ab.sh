#!/bin/bash
# 4 clients on the 27B-proportioned model, int8 AVX2, one warm server at --spec-depth auto:
# rounds alternate depth 0 (per-request num_speculative_tokens=0) and auto, the order
# swapped every round; every round's prompts are salted so none reuses another's prefix.
# usage: BIN=path/to/tandem TAG=new ROUNDS=6 warm-ab.sh   (from the repository root)
. "$(dirname "$0")/env.sh"
ROUNDS=${ROUNDS:-6}
PORT=${PORT:-8123}
out=$OUTDIR/warm-$TAG.txt
: > $out
$BIN serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth auto --port $PORT > $OUTDIR/serve-warm-$TAG.log 2>&1 &
pid=$!
for i in $(seq 1 300); do grep -q "ready on" $OUTDIR/serve-warm-$TAG.log && break; sleep 1; done
metrics() { curl -s http://127.0.0.1:$PORT/metrics | grep -E "^tandem_spec_chosen_depth_bucket|^tandem_spec_explored|^tandem_spec_tracked" | awk '{print $2}' | tr '\n' ' '; }
load() { # $1 depth (- for auto) $2 salt
  local extra=""
  [ "$1" != "-" ] && extra="--num-speculative-tokens $1"
  $PY bench/serve_load.py --url http://127.0.0.1:$PORT/v1 --clients 4 --requests 16 --max-tokens 64 --salt $2 $extra 2>&1 | tail -1
}
echo "warmup :: $(load - w0) :: $(metrics)" >> $out
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="0 -"; else order="- 0"; fi
  for d in $order; do
    res=$(load $d $TAG-r$r-d$d)
    echo "round $r depth ${d/-/auto} :: $res :: chosen(le0..4,+inf) explored tracked: $(metrics)" >> $out
  done
done
echo "AnonHugePages kB: $(grep AnonHugePages /proc/$pid/smaps_rollup 2>/dev/null | awk '{print $2}')" >> $out
kill $pid; wait $pid 2>/dev/null
echo done >> $out

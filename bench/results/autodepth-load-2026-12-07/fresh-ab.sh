#!/bin/bash
# 4 clients on the 27B-proportioned model, int8 AVX2: a fresh server per setting
# (--spec-depth 0 or auto; SETTINGr0, e.g. autor0 or 4r0: that server, its
# requests all asking for num_speculative_tokens 0), the order reversed every round.
# usage: BIN=path/to/tandem TAG=new ROUNDS=4 [SETTINGS="0 auto autor0"] fresh-ab.sh   (from the repository root)
. "$(dirname "$0")/env.sh"
ROUNDS=${ROUNDS:-4}
PORT=${PORT:-8125}
out=$OUTDIR/fresh-$TAG.txt
: > $out
SETTINGS=${SETTINGS:-0 auto}
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="$SETTINGS"; else order=$(echo $SETTINGS | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for d in $order; do
    sd=$d; extra=""
    case $d in *r0) sd=${d%r0}; extra="--num-speculative-tokens 0";; esac
    log=$OUTDIR/serve-fresh-$TAG-$r-$d.log
    $BIN serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth $sd --port $PORT > $log 2>&1 &
    pid=$!
    for i in $(seq 1 300); do grep -q "ready on" $log && break; sleep 1; done
    res=$($PY bench/serve_load.py --url http://127.0.0.1:$PORT/v1 --clients 4 --requests 16 --max-tokens 64 $extra 2>&1 | tail -1)
    met=$(curl -s http://127.0.0.1:$PORT/metrics | grep -E "^tandem_spec_chosen_depth_bucket|^tandem_spec_explored|^tandem_spec_tracked" | awk '{print $2}' | tr '\n' ' ')
    hp=$(grep AnonHugePages /proc/$pid/smaps_rollup 2>/dev/null | awk '{print $2}')
    echo "round $r depth $d :: $res :: chosen(le0..4,+inf) explored tracked: $met :: AnonHugePages kB: $hp" >> $out
    kill $pid; wait $pid 2>/dev/null
  done
done
echo done >> $out

#!/bin/bash
# 4 clients on the 27B-proportioned model, int8 AVX2: a fresh server per setting
# (--spec-depth 0 or auto), the order swapped every round.
# usage: BIN=path/to/tandem TAG=new ROUNDS=4 fresh-ab.sh   (from the repository root)
BIN=${BIN:-build/tandem}
TAG=${TAG:-new}
ROUNDS=${ROUNDS:-4}
OUTDIR=${OUTDIR:-/tmp/s12}
PY=${PY:-build/venv-py/bin/python}
PORT=${PORT:-8125}
out=$OUTDIR/fresh-$TAG.txt
: > $out
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="0 auto"; else order="auto 0"; fi
  for d in $order; do
    log=$OUTDIR/serve-fresh-$TAG-$r-$d.log
    $BIN serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth $d --port $PORT > $log 2>&1 &
    pid=$!
    for i in $(seq 1 300); do grep -q "ready on" $log && break; sleep 1; done
    res=$($PY bench/serve_load.py --url http://127.0.0.1:$PORT/v1 --clients 4 --requests 16 --max-tokens 64 2>&1 | tail -1)
    met=$(curl -s http://127.0.0.1:$PORT/metrics | grep -E "^tandem_spec_chosen_depth_bucket|^tandem_spec_explored|^tandem_spec_tracked" | awk '{print $2}' | tr '\n' ' ')
    echo "round $r depth $d :: $res :: chosen(le0..4,+inf) explored tracked: $met" >> $out
    kill $pid; wait $pid 2>/dev/null
  done
done
echo done >> $out

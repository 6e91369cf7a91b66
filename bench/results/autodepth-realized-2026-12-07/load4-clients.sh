#!/bin/bash
# builds: BIN = 635c8b8
# 4 clients on the 27B-proportioned model, int8 AVX2: fresh server per setting, settings rotated per round
cd "$(dirname "$0")/../../.."
mkdir -p build/load-ab
BIN=${BIN:-build/tandem}
PY=build/venv-py/bin/python
out=build/load-ab/load4.txt
: > $out
rounds=${ROUNDS:-2}
for r in $(seq 1 $rounds); do
  case $r in 1) order="0 2 4 auto";; 2) order="auto 4 2 0";; 3) order="2 auto 0 4";; *) order="4 0 auto 2";; esac
  for d in $order; do
    $BIN serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth $d --port 8123 > build/load-ab/serve-$r-$d.log 2>&1 &
    pid=$!
    for i in $(seq 1 240); do grep -q "ready on" build/load-ab/serve-$r-$d.log && break; sleep 1; done
    res=$($PY bench/serve_load.py --url http://127.0.0.1:8123/v1 --clients 4 --requests 16 --max-tokens 64 2>&1 | tail -3 | tr '\n' ' ')
    met=$(curl -s http://127.0.0.1:8123/metrics | grep -E "^tandem_spec_chosen_depth_bucket|^tandem_spec_explored" | awk '{print $2}' | tr '\n' ' ')
    echo "round $r depth $d :: $res :: chosen(le0..4,+inf) explored: $met" >> $out
    kill $pid; wait $pid 2>/dev/null
  done
done
echo done >> $out

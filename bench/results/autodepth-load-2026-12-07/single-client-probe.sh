cd "$(dirname "$0")/../../.."
mkdir -p build/load-ab
for r in 1 2; do
 for cfg in "0 0" "auto 0" ; do
  set -- $cfg
  build/tandem serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth $1 --port 8126 > build/load-ab/p1.log 2>&1 &
  pid=$!
  for i in $(seq 1 300); do grep -q "ready on" build/load-ab/p1.log && break; sleep 1; done
  echo "round $r server $1 req $2 :: $(build/venv-py/bin/python bench/results/autodepth-load-2026-12-07/single-client-probe.py http://127.0.0.1:8126 $2 r$r)"
  kill $pid; wait $pid 2>/dev/null
 done
done

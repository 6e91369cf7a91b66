cd "$(dirname "$0")/../../.."
mkdir -p build/load-ab
for d in 0 autor0 auto; do
  sd=$d; extra=""
  case $d in *r0) sd=${d%r0}; extra="--num-speculative-tokens 0";; esac
  build/tandem serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth $sd --port 8127 > build/load-ab/prof-$d.log 2>&1 &
  pid=$!
  for i in $(seq 1 300); do grep -q "ready on" build/load-ab/prof-$d.log && break; sleep 1; done
  perf record -F 299 -g -p $pid -o build/load-ab/perf-$d.data > /dev/null 2>&1 &
  ppid=$!
  sleep 1
  res=$(build/venv-py/bin/python bench/serve_load.py --url http://127.0.0.1:8127/v1 --clients 4 --requests 16 --max-tokens 64 $extra 2>&1 | tail -1)
  kill -INT $ppid; wait $ppid
  echo "$d :: $res"
  kill $pid; wait $pid 2>/dev/null
done

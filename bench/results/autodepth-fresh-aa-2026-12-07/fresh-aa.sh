#!/bin/bash
# 4 clients on the 27B-proportioned model, int8 AVX2, a fresh server per setting, the order
# reversed every round. Settings:
#   0, 0b   two identical --spec-depth 0 servers (the A/A pair: what a fresh process alone moves)
#   auto    --spec-depth auto
#   autor0  --spec-depth auto, every request asking num_speculative_tokens 0
#   4r0     --spec-depth 4, every request asking num_speculative_tokens 0
#   ncr0    as autor0 with the start-up calibration skipped: needs SKIPCAL_BIN, a tandem built
#           with skip-calibration.patch (TD_SKIP_CAL=1 then skips td_engine_calibrate_spec)
# usage (from the repository root):
#   BIN=build/tandem TAG=c ROUNDS=6 SETTINGS="0 auto 0b" bench/results/autodepth-fresh-aa-2026-12-07/fresh-aa.sh
BIN=${BIN:-build/tandem}
TAG=${TAG:-new}
OUTDIR=${OUTDIR:-build/load-ab}
PY=${PY:-build/venv-py/bin/python}
ROUNDS=${ROUNDS:-5}
PORT=${PORT:-8131}
SETTINGS=${SETTINGS:-0 autor0 0b 4r0}
mkdir -p $OUTDIR
out=$OUTDIR/fresh-aa-$TAG.txt
: > $out
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="$SETTINGS"; else order=$(echo $SETTINGS | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for d in $order; do
    bin=$BIN; sd=0; extra=""; envp=""
    case $d in
      0|0b) sd=0;;
      auto) sd=auto;;
      autor0) sd=auto; extra="--num-speculative-tokens 0";;
      4r0) sd=4; extra="--num-speculative-tokens 0";;
      ncr0) sd=auto; extra="--num-speculative-tokens 0"; bin=${SKIPCAL_BIN:?ncr0 needs SKIPCAL_BIN}; envp="TD_SKIP_CAL=1";;
      *) echo "unknown setting $d" >&2; exit 2;;
    esac
    log=$OUTDIR/serve-aa-$TAG-$r-$d.log
    env $envp $bin serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth $sd --port $PORT > $log 2>&1 &
    pid=$!
    for i in $(seq 1 300); do grep -q "ready on" $log && break; sleep 1; done
    res=$($PY bench/serve_load.py --url http://127.0.0.1:$PORT/v1 --clients 4 --requests 16 --max-tokens 64 $extra 2>&1 | tail -1)
    # the server's anonymous memory in transparent huge pages, and its resident size (kB)
    thp=$(awk '/^AnonHugePages/ {print $2}' /proc/$pid/smaps_rollup 2>/dev/null)
    rss=$(awk '/^Rss/ {print $2}' /proc/$pid/smaps_rollup 2>/dev/null)
    echo "round $r $d :: $res :: thp_kB $thp rss_kB $rss" >> $out
    kill $pid; wait $pid 2>/dev/null
  done
done
echo done >> $out

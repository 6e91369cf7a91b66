#!/bin/bash
# Time inside td_forward and td_mtp_forward over one 4-client round, per fresh server.
# BINS="name:binary ..." where each binary is a tandem built with forward-time.patch applied
# (it prints "TMPSTAT fwd S s CALLS calls ROWS rows | mtp ..." at exit). SETTINGS: the
# server kinds to run with each binary: autoidle (calibration only, no load), auto, 0, autor0,
# 4r0 (a --spec-depth 4 server, every request asking for depth 0).
# usage (from the repository root):
#   BINS="new:/tmp/tandem-timed" SETTINGS="autoidle auto 0 autor0" bench/results/autodepth-fresh-aa-2026-12-07/forward-time.sh
OUTDIR=${OUTDIR:-build/load-ab}
PY=${PY:-build/venv-py/bin/python}
SETTINGS=${SETTINGS:-auto}
mkdir -p $OUTDIR
out=$OUTDIR/forward-time.txt
for nb in $BINS; do IFS=: read name bin <<< "$nb"
  for d in $SETTINGS; do
    sd=$d; extra=""; load=1
    case $d in autoidle) sd=auto; load=0;; autor0) sd=auto; extra="--num-speculative-tokens 0";; 4r0) sd=4; extra="--num-speculative-tokens 0";; esac
    log=$OUTDIR/forward-time-$name-$d.log
    $bin serve -m build/rand27b-mtp --quantize q8 --isa avx2 --precision int8 --spec-depth $sd --port 8151 > $log 2>&1 &
    pid=$!
    for i in $(seq 1 300); do grep -q "ready on" $log && break; sleep 1; done
    res=""
    [ $load = 1 ] && res=$($PY bench/serve_load.py --url http://127.0.0.1:8151/v1 --clients 4 --requests 16 --max-tokens 64 $extra 2>&1 | tail -1)
    kill $pid; wait $pid
    echo "$name $d :: $res :: $(grep TMPSTAT $log)" >> $out
  done
done

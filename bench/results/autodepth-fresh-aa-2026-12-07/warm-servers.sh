#!/bin/bash
# Warm servers side by side, one round at a time (the others idle), 4 clients on the
# 27B-proportioned model, int8 AVX2 (or MODEL with MARGS, e.g. MODEL=models/demo MARGS= REQUESTS=48). SERVERS="name:binary:spec-depth:port ...";
# a setting name ending in r0 sends num_speculative_tokens 0 to that server instead
# (e.g. "autor0:build/tandem:auto:8142" next to "auto:build/tandem:auto:8142" is one server
# listed twice: both names must then use the same port and binary and it is started once).
# Every round's prompts are salted; the order is reversed every round.
# usage (from the repository root):
#   SERVERS="0:build/tandem:0:8141 auto:build/tandem:auto:8142" ROUNDS=6 TAG=a bench/results/autodepth-fresh-aa-2026-12-07/warm-servers.sh
OUTDIR=${OUTDIR:-build/load-ab}
PY=${PY:-build/venv-py/bin/python}
ROUNDS=${ROUNDS:-6}
MODEL=${MODEL:-build/rand27b-mtp}
MARGS=${MARGS---quantize q8 --isa avx2 --precision int8}
REQUESTS=${REQUESTS:-16}
TAG=${TAG:-a}
mkdir -p $OUTDIR
out=$OUTDIR/warm-servers-$TAG.txt
: > $out
names=""; pids=""; started=""
for s in $SERVERS; do IFS=: read n b d p <<< "$s"
  names="$names $n"
  case " $started " in *" $p "*) continue;; esac
  log=$OUTDIR/warm-servers-$TAG-$n.log
  $b serve -m $MODEL $MARGS --spec-depth $d --port $p > $log 2>&1 &
  pids="$pids $!"; started="$started $p"
  for i in $(seq 1 300); do grep -q "ready on" $log && break; sleep 1; done
done
port_of() { for s in $SERVERS; do IFS=: read n b d p <<< "$s"; [ $n = $1 ] && echo $p; done; }
met() { curl -s http://127.0.0.1:$1/metrics | grep -E "^tandem_spec_chosen_depth_bucket|^tandem_spec_explored|^tandem_spec_tracked" | awk '{print $2}' | tr '\n' ' '; }
load() { extra=""; case $1 in *r0) extra="--num-speculative-tokens 0";; esac
  $PY bench/serve_load.py --url http://127.0.0.1:$(port_of $1)/v1 --clients 4 --requests $REQUESTS --max-tokens 64 --salt $2$1 $extra 2>&1 | tail -1; }
for n in $names; do echo "warmup $n :: $(load $n w) :: $(met $(port_of $n))" >> $out; done
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then order="$names"; else order=$(echo $names | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for n in $order; do echo "round $r $n :: $(load $n r$r) :: $(met $(port_of $n))" >> $out; done
done
kill $pids; wait
echo done >> $out

#!/usr/bin/env bash
# --precision f32 vs bf16 side by side (issue 18 item 4): `tandem kernels` on one model,
# the two precisions alternating within each round (the order swapped every round, so
# drift in the machine's load hits both alike); prints a markdown table of medians and
# the ratio bf16 / f32 (for ms: f32 / bf16, so > 1 means bf16 is faster everywhere).
#
#   bench/precision_compare.sh [MODEL_DIR]      # default build/rand27b-mtp
#
# Environment: TANDEM [build/tandem]  ROUNDS [3]  THREADS [2]  REPS [5]  PREFILL [512]  KEEP (a folder for the raw outputs)
#              EXTRA (more `tandem kernels` flags, e.g. "--quantize q8")
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-build/rand27b-mtp}
TANDEM=${TANDEM:-build/tandem}; ROUNDS=${ROUNDS:-3}; THREADS=${THREADS:-2}; REPS=${REPS:-5}; PREFILL=${PREFILL:-512}
EXTRA=${EXTRA:-}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run() { # precision round -> one line: decode_tok_s v1 v2 v3 v4 (ms) prefill_tok_s
  # shellcheck disable=SC2086
  "$TANDEM" kernels -m "$MODEL" -t "$THREADS" --precision "$1" --prefill "$PREFILL" --max-k 4 --reps "$REPS" \
    --mm-mb 0 --probe-mb 256 $EXTRA > "$tmp/$1.$2.txt"
  awk '/^decode \(depth 0\)/ {d = $4}
       /^\| [1-4] \| [2-5] \|/ {v[$2] = $6}
       /^\| [0-9]+ \| [0-9.]+ \| [0-9.]+ \|$/ {p = $6}
       END {printf "%s %s %s %s %s %s\n", d, v[1], v[2], v[3], v[4], p}' "$tmp/$1.$2.txt"
}
la0=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="f32 bf16"; else order="bf16 f32"; fi
  for p in $order; do run "$p" "$r" >> "$tmp/$p.all"; done
  cp "$tmp/f32.$r.txt" "$tmp/bf16.$r.txt" "${KEEP:-$tmp}/" 2>/dev/null || true
done
la1=$(cut -d' ' -f1 /proc/loadavg)
isa=$(grep -m1 '^# tandem kernels' "$tmp/f32.1.txt" || true)
echo "$isa"
echo "model $MODEL, $THREADS threads, $ROUNDS rounds (order swapped each round), load average $la0 before, $la1 after${EXTRA:+, $EXTRA}"
echo
echo "| metric | f32 (median) | bf16 (median) | bf16 gain | f32 samples | bf16 samples |"
echo "|---|---|---|---|---|---|"
names=("decode tokens/s" "verify k=1 ms" "verify k=2 ms" "verify k=3 ms" "verify k=4 ms" "prefill-$PREFILL tokens/s")
for c in 1 2 3 4 5 6; do
  f=$(cut -d' ' -f$c "$tmp/f32.all" | sort -g | tr '\n' ' '); b=$(cut -d' ' -f$c "$tmp/bf16.all" | sort -g | tr '\n' ' ')
  mf=$(echo "$f" | awk '{print $((NF + 1) / 2 < 1 ? 1 : int((NF + 1) / 2))}'); mb=$(echo "$b" | awk '{print $((NF + 1) / 2 < 1 ? 1 : int((NF + 1) / 2))}')
  gain=$(awk -v f="$mf" -v b="$mb" -v c="$c" 'BEGIN {if (c >= 2 && c <= 5) printf "%.2fx", f / b; else printf "%.2fx", b / f}')
  echo "| ${names[$((c - 1))]} | $mf | $mb | $gain | $(cut -d' ' -f$c "$tmp/f32.all" | tr '\n' ' ') | $(cut -d' ' -f$c "$tmp/bf16.all" | tr '\n' ' ') |"
done
# verify cost t(k+1)/t(1) from the medians, t(1) = one decode step
for p in f32 bf16; do
  d=$(cut -d' ' -f1 "$tmp/$p.all" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  v=$(cut -d' ' -f5 "$tmp/$p.all" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  awk -v p="$p" -v d="$d" -v v="$v" 'BEGIN {printf "%s: verify of 5 tokens / decode step (medians) = %.2f\n", p, v / (1000 / d)}'
done

#!/usr/bin/env bash
# Side by side with llama.cpp on this CPU (issue 9 item 4): the same random-weight
# qwen3_5 model in both engines, same threads, run alternately (tandem, llama.cpp,
# tandem, llama.cpp, ...) so that drift in the machine's load hits both alike.
# Prints a markdown table of medians and ratios (tandem / llama.cpp).
#
#   bench/llamacpp_compare.sh            # settings from the environment, below
#
# Environment (defaults in brackets):
#   LLAMA_CPP   llama.cpp tree with build/bin/llama-bench      [build/llama.cpp]
#   TANDEM      tandem binary                                   [build/tandem]
#   PAIRS       "label:tandem_dir:gguf[:tandem_quantize[:tandem_args]] ..."   [bf16 and 8-bit, below]
#               (tandem_quantize: q8 = `--quantize q8` at load; tandem_args: extra tandem
#               flags, commas for spaces, e.g. BF16-bf16:DIR:GGUF::--precision,bf16)
#   LLAMA_ENV   environment for llama-bench                     [OMP_WAIT_POLICY=passive]
#   LLAMA_ARGS  extra llama-bench arguments                     [--repack 0]
#   ROUNDS [3]  THREADS [2]  NGEN [64]  NPROMPT [512]  REPS [8] (tandem decode reps)
#
# Getting llama.cpp without git: the llama-cpp-python source package on PyPI vendors it
# (0.3.36 = llama.cpp 0c1e57098, the commit of bench/results/):
#   pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps; tar xzf llama_cpp_python-0.3.36.tar.gz
#   cp -r llama_cpp_python-0.3.36/vendor/llama.cpp build/llama.cpp && cd build/llama.cpp
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF [-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON
#         -DGGML_F16C=ON -DGGML_AVX512=OFF: the AVX2 path] && cmake --build build -j --target llama-bench llama-quantize
#   (the converter below needs torch, transformers and numpy: a virtualenv outside the repo)
# Preparing the models (once; nothing of llama.cpp is in this repo):
#   python3 tools/bench/make_random_model.py build/rand-27b-scaled
#   python tools/bench/make_fp8_copy.py build/rand-27b-scaled build/rand-27b-scaled-fp8
#   # an HF dir for llama.cpp's converter: the model + a stand-in tokenizer
#   # (tests/golden/tiny-b/bf16/tokenizer*.json, tokenizer_class PreTrainedTokenizerFast)
#   python tools/bench/llamacpp_convert.py $LLAMA_CPP HF_DIR --no-mtp --outtype bf16 --outfile M-bf16.gguf
#   $LLAMA_CPP/build/bin/llama-quantize M-bf16.gguf M-q8_0.gguf Q8_0
#
# What is measured:
#   tandem:    `tandem kernels -m DIR -t THREADS --prefill NPROMPT --max-k 1`: decode = median
#              of REPS single-token steps after a 16-token prompt; prefill = one NPROMPT-token forward.
# Why the llama.cpp defaults: on a 2-core box that other jobs load, llama.cpp's OpenMP
# threads spin at barriers and 2-thread decode collapses (~10x slower than 1 thread);
# passive waiting avoids that. --repack 0 turns off the extra buffer types: its AMX path
# (built with GGML_NATIVE on an AMX CPU) segfaults in this VM.
#   llama.cpp: `llama-bench -t THREADS -p NPROMPT -n NGEN -r 1` (after its warm-up run):
#              tg NGEN (mean over NGEN tokens from depth 0) and pp NPROMPT.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA_CPP=${LLAMA_CPP:-build/llama.cpp}
TANDEM=${TANDEM:-build/tandem}
ROUNDS=${ROUNDS:-3}; THREADS=${THREADS:-2}; NGEN=${NGEN:-64}; NPROMPT=${NPROMPT:-512}; REPS=${REPS:-8}
LLAMA_ENV=${LLAMA_ENV-OMP_WAIT_POLICY=passive}; LLAMA_ARGS=${LLAMA_ARGS---repack 0}
M=${GGUF_DIR:-build/lcp-models}
PAIRS=${PAIRS:-"BF16-vs-BF16:build/rand-27b-scaled:$M/rand-27b-scaled-bf16.gguf FP8-vs-Q8_0:build/rand-27b-scaled-fp8:$M/rand-27b-scaled-q8_0.gguf"}
BENCH=$LLAMA_CPP/build/bin/llama-bench
[ -x "$BENCH" ] || { echo "no $BENCH: build llama.cpp first" >&2; exit 1; }
[ -x "$TANDEM" ] || { echo "no $TANDEM: make first" >&2; exit 1; }
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT

echo "# tandem vs llama.cpp, $(date -u +%Y-%m-%dT%H:%MZ), $THREADS threads, $ROUNDS rounds alternating"
echo
echo "llama.cpp: $("$BENCH" --version 2>&1 | head -1 || true)"
echo "llama-bench settings: env '$LLAMA_ENV', args '$LLAMA_ARGS'"
echo "load before: $(uptime | sed 's/.*load/load/')"
echo
echo "| pair | metric | tandem (median) | llama.cpp (median) | tandem / llama.cpp | tandem samples | llama.cpp samples |"
echo "|---|---|---|---|---|---|---|"
for pair in $PAIRS; do
    IFS=: read -r label tdir gguf tquant targs <<<"$pair"
    targs=${targs//,/ }
    for f in "$tdir/model.safetensors" "$gguf"; do [ -e "$f" ] || { echo "missing $f" >&2; exit 1; }; done
    : >"$LOG/td"; : >"$LOG/lc"
    for r in $(seq 1 "$ROUNDS"); do
        for who in td lc; do   # ABAB...: tandem, then llama.cpp, each round
            if [ "$who" = td ]; then
                out=$("$TANDEM" kernels -m "$tdir" --quantize "${tquant:-none}" -t "$THREADS" --reps "$REPS" --probe-mb 64 --mm-mb 0 --max-k 1 --prefill "$NPROMPT" $targs 2>&1)
                dec=$(sed -n 's/^decode (depth 0): \([0-9.]*\) tokens\/s.*/\1/p' <<<"$out")
                pre=$(awk -F'|' -v n="$NPROMPT" '$2+0==n && NF>=5 {gsub(/ /,"",$4); print $4}' <<<"$out")
                [ -n "$dec" ] && [ -n "$pre" ] || { echo "tandem failed: $out" >&2; exit 1; }
                echo "$dec $pre" >>"$LOG/td"
            else
                env $LLAMA_ENV "$BENCH" $LLAMA_ARGS -m "$gguf" -t "$THREADS" -p "$NPROMPT" -n "$NGEN" -r 1 -o json >"$LOG/lc.json" 2>"$LOG/lc.err" ||
                    { cat "$LOG/lc.err" >&2; exit 1; }
                python3 - "$LOG/lc.json" >>"$LOG/lc" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
ts = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}
print(ts["tg"], ts["pp"])
PY
            fi
        done
    done
    python3 - "$label" "$LOG/td" "$LOG/lc" "$NGEN" "$NPROMPT" <<'PY'
import statistics as st, sys
label, ftd, flc, ngen, npro = sys.argv[1:]
td = [list(map(float, l.split())) for l in open(ftd)]
lc = [list(map(float, l.split())) for l in open(flc)]
for i, name in enumerate([f"decode tokens/s (tandem: median step after a 16-token prompt / llama.cpp tg{ngen})", f"prefill {npro} tokens/s"]):
    a, b = [x[i] for x in td], [x[i] for x in lc]
    ma, mb = st.median(a), st.median(b)
    print(f"| {label} | {name} | {ma:.2f} | {mb:.2f} | {ma / mb:.2f}x | {', '.join(f'{x:.2f}' for x in a)} | {', '.join(f'{x:.2f}' for x in b)} |")
PY
done
echo
echo "load after: $(uptime | sed 's/.*load/load/')"

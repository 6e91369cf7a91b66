#!/bin/sh
# Tokenizer speed: tandem vs HF tokenizers, single thread, same corpus, one run.
# Usage: sh bench/tokenizer/run.sh [MODEL_DIR] [PYTHON]   (from the repo root)
# PYTHON needs tokenizers==0.23.3 (e.g. /work/venv-ref/bin/python).
set -e
DIR=${1:-tests/data/qwen3-tokenizer}
PY=${2:-python3}
BUILD=${BUILD:-build}
make -s "$BUILD/libtandem.a"
cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o "$BUILD/tok_bench" bench/tokenizer/tok_bench.c "$BUILD/libtandem.a" \
   -ljansson -lpcre2-8 -lutf8proc -lxxhash -lm -pthread
CORPUS="$BUILD/tok_bench_corpus.txt"
"$PY" bench/tokenizer/make_corpus.py "$CORPUS" 10
"$BUILD/tok_bench" "$DIR" "$CORPUS" 3
"$PY" bench/tokenizer/hf_bench.py "$DIR" "$CORPUS" 3

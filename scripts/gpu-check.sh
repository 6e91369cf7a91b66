#!/bin/sh
# The CUDA backend's first check, for a session that is lent a GPU (H200:
# about 8 minutes). Nothing in src/backend/cuda has run on a GPU before this.
#   1. build with CUDA=1 for this GPU's architecture only (fast);
#   2. test_backend_cuda and test_cuda_fast_ops: the CUDA ops against the CPU op by op (matmul in
#      every weight dtype and its batch invariance, KV rows, sampler, ...):
#      a wrong kernel shows up here by name;
#   3. the engine's C tests with TANDEM_BACKEND=cuda (golden logits against
#      the transformers references, greedy identity with MTP drafting at every
#      depth, KV / prefix-cache exactness, scheduling), one summary line;
#   4. a short decode / verify / prefill timing of the demo model on the GPU;
#   5. the same rows at the full Qwen3.6-27B config in BF16, FP8 and NVFP4, the
#      weights generated on the GPU (--random-config: no weight files), each
#      bounded (60 s each);
#   6. NVFP4 decode / verify again with --enforce-eager (graphs vs eager), and
#      test_cuda_graphs' graph count, nodes and the bytes their instantiation took;
#   7. NVFP4 prefill 512 with --batch-invariant (exact kernels) against step 5's
#      fast rows (cuBLAS BF16 GEMM), and test_cuda_fast (fast vs CPU tolerance);
#   8. FP8 (128 x 128 blocks) prefill with TANDEM_CUDA_LT=0 (BF16 tensor cores)
#      against step 5's fp8 rows (cuBLASLt FP8 tensor cores where taken), and
#      which cuBLASLt paths test_cuda_fast_ops found on this device;
#   9. long context: NVFP4 decode / verify at position 8192, split attention
#      (the fast mode's default, partitions of 2048) against
#      TD_CUDA_ATTN_SPLIT=0 (one block per row and head), only with
#      150 s of the budget left (else skipped, not failed);
#  10. prefill attention: a 4096-token tail after 32768 tokens on the tensor-core
#      tiles and TD_CUDA_ATTN_TILE=1 (f32 tiles on CUDA cores); 512 from 0 with
#      =0 (per-row) against step 5's row; with 150 s of the budget left (else skipped).
# The whole script stays under BUDGET seconds (default 460, under 8 minutes): each
# step's timeout is its own cap or what is left of the budget, whichever is smaller,
# and a step with under 10 s left is skipped (and counts as failed).
# Usage: sh scripts/gpu-check.sh    (BUILD=dir to build elsewhere; FULL=1: every C test in step 3)
# Logs: $BUILD/gpu-*.log. Exit status: non-zero when a step failed.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
fail=0
END=$(( $(date +%s) + ${BUDGET:-460} ))
# t CAP: seconds for the next step, at most CAP and what the budget has left
t() { left=$(( END - $(date +%s) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
# run CAP cmd...: the command under timeout t(CAP); skipped when under 10 s are left
# (environment for the command: `run CAP env VAR=value cmd...`)
run() { cap=$(t "$1"); shift; if [ "$cap" -lt 10 ]; then echo "gpu-check: out of time, skipped: $*"; return 1; fi; timeout "$cap" "$@"; }
# the 27B rows: a random-weight model of the real config generated on the GPU (word-split: BUILD without spaces)
K27="$BUILD/tandem kernels --random-config tests/data/configs/qwen3.6-27b.config.json --device cuda --probe-mb 16 --mm-mb 0"
nvidia-smi -L || { echo "gpu-check: no GPU here (nvidia-smi failed)"; exit 1; }
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
echo "gpu-check: building $BUILD for sm_${ARCH:-90}"
mkdir -p "$BUILD"
if ! run 180 make BUILD="$BUILD" CUDA=1 CUDA_ARCHS="${ARCH:-90}" -j"$(nproc)" all tests > "$BUILD/gpu-build.log" 2>&1; then
  tail -n 30 "$BUILD/gpu-build.log"; echo "gpu-check: build failed"; exit 1
fi

echo "== 1. op by op (test_backend_cuda, test_cuda_fast_ops)"
run 60 "$BUILD/tests/test_backend_cuda" > "$BUILD/gpu-ops.log" 2>&1 || fail=1
run 60 "$BUILD/tests/test_cuda_fast_ops" >> "$BUILD/gpu-ops.log" 2>&1 || fail=1
grep -E '^FAIL' "$BUILD/gpu-ops.log" | head -n 20
grep -E ': [0-9]+ passed, [0-9]+ failed' "$BUILD/gpu-ops.log"

echo "== 2. the C tests on the cuda backend"
# The engine-core tests (as .ci/run runs on the guard); FULL=1 runs all of them.
TESTS="test_backend_cuda test_cuda_graphs test_golden test_demo test_spec test_kv test_kv_pressure test_gdn_chunk test_quant \
test_quant_load test_real_ckpt test_sched test_preempt test_logit_bias test_constraint test_autodepth test_random_model"
[ "${FULL:-0}" = 1 ] && TESTS=""
# TANDEM_BATCH_INVARIANT=1: these tests check exact figures (golden logits to 1e-5, depth k = depth 0),
# so they run the batch-invariant kernels. test_cuda_fast sets each engine's mode itself and needs the
# env unset (else its fast engine is exact too): it runs on its own below.
run 150 env BUILD="$BUILD" TANDEM_BATCH_INVARIANT=1 TANDEM_BACKEND=cuda TANDEM_SKIP_PY=1 TANDEM_TESTS="$TESTS" sh tests/run_all.sh \
  > "$BUILD/gpu-suite.log" 2>&1 || fail=1
grep -E '^FAIL|exited with|: [0-9]+ passed, [1-9][0-9]* failed' "$BUILD/gpu-suite.log" | head -n 20
echo "cuda suite: $(tail -n 1 "$BUILD/gpu-suite.log")"
echo "== 2b. the fast mode (cuBLAS prefill) against the CPU and the batch-invariant mode"
run 60 "$BUILD/tests/test_cuda_fast" > "$BUILD/gpu-fast.log" 2>&1 || fail=1
tail -n 3 "$BUILD/gpu-fast.log"

echo "== 3. timing: demo model, decode / verify t(k+1)/t(1) / prefill on cuda"
# `tandem kernels` opens its model rows through td_engine_load, which takes
# $TANDEM_BACKEND; its bandwidth probe is the host's (a CPU backend).
run 45 env TANDEM_BACKEND=cuda "$BUILD/tandem" kernels -m models/demo --probe-mb 16 --mm-mb 0 --prefill 512 --max-k 6 \
  --reps 3 > "$BUILD/gpu-timing.log" 2>&1 || fail=1
tail -n 20 "$BUILD/gpu-timing.log"
run 30 "$BUILD/tandem" run --device cuda -m models/demo -p "The capital of France is" -n 16 --stats || fail=1

echo "== 4. timing: Qwen3.6-27B config, random weights generated on the GPU, bf16 / fp8 / nvfp4"
for dt in bf16 fp8 nvfp4; do
  run 60 $K27 --dtype $dt \
    --reps 1 --prefill 512,4096 --max-k 4 > "$BUILD/gpu-27b-$dt.log" 2>&1 || fail=1
  grep -v "^$" "$BUILD/gpu-27b-$dt.log" | tail -n 14
done
echo "== 5. CUDA graphs vs eager: the 27B config in nvfp4, decode and verify without graphs"
run 45 $K27 --dtype nvfp4 \
  --reps 1 --prefill 0 --max-k 4 --enforce-eager > "$BUILD/gpu-27b-eager.log" 2>&1 || fail=1
grep -v "^$" "$BUILD/gpu-27b-eager.log" | tail -n 8
grep -h "cuda graphs:" "$BUILD/gpu-suite.log" | head -n 2
echo "== 6. prefill in the batch-invariant mode (exact kernels, no tensor cores) vs the fast rows of step 4"
run 45 $K27 --dtype nvfp4 \
  --reps 1 --prefill 512 --max-k 1 --batch-invariant > "$BUILD/gpu-27b-exact.log" 2>&1 || fail=1
grep -v "^$" "$BUILD/gpu-27b-exact.log" | tail -n 6

echo "== 7. FP8 prefill: cuBLASLt FP8 tensor cores (step 4's fp8 rows) vs TANDEM_CUDA_LT=0 (BF16 tensor cores)"
grep -h "sm_[0-9]*: FP8 path\|cuBLASLt" "$BUILD/gpu-ops.log" | head -n 4
run 45 env TANDEM_CUDA_LT=0 $K27 --dtype fp8 \
  --reps 1 --prefill 512,4096 --max-k 1 > "$BUILD/gpu-27b-fp8-nolt.log" 2>&1 || fail=1
grep -v "^$" "$BUILD/gpu-27b-fp8-nolt.log" | tail -n 6

echo "== 8. decode / verify at position 8192: split attention (default) vs one block per row and head"
# optional: runs only when 150 s of the budget are left (a skip here is not a failure)
if [ "$(t 150)" -ge 150 ]; then
  for sp in 2048 0; do
    run 75 env TD_CUDA_ATTN_SPLIT=$sp $K27 \
      --dtype nvfp4 --reps 3 --prefill 0 --max-k 2 --decode-at 8192 > "$BUILD/gpu-27b-ctx8k-$sp.log" 2>&1 || fail=1
    echo "split $sp:"; grep -E "^decode|^\| [12] \|" "$BUILD/gpu-27b-ctx8k-$sp.log"
  done
else
  echo "gpu-check: step 8 skipped (under 150 s of the budget left)"
fi

echo "== 9. prefill attention: tensor-core tiles (default) vs f32 tiles (TD_CUDA_ATTN_TILE=1) vs per-row (=0)"
# optional: runs only when 150 s of the budget are left (a skip here is not a failure). A 4096-token
# tail after a 32768-token prompt (a prefix-cache hit, the agent case) on both tiled kernels; the
# per-row kernel only at 512 from position 0 (at 32k it would read the cache once per row and head).
if [ "$(t 150)" -ge 150 ]; then
  for tl in 2 1; do
    run 60 env TD_CUDA_ATTN_TILE=$tl $K27 \
      --dtype nvfp4 --reps 1 --prefill 4096 --prefill-at 32768 --max-k 1 > "$BUILD/gpu-27b-tile$tl.log" 2>&1 || fail=1
    echo "TD_CUDA_ATTN_TILE=$tl, after 32768:"; grep -E "^\| 4096 \|" "$BUILD/gpu-27b-tile$tl.log"
  done
  grep -E "^\| 512 \|" "$BUILD/gpu-27b-nvfp4.log" | sed 's/^/tensor-core tiles, from 0: /'
  run 40 env TD_CUDA_ATTN_TILE=0 $K27 \
    --dtype nvfp4 --reps 1 --prefill 512 --max-k 1 > "$BUILD/gpu-27b-tile0.log" 2>&1 || fail=1
  grep -E "^\| 512 \|" "$BUILD/gpu-27b-tile0.log" | sed 's/^/per-row, from 0: /'
else
  echo "gpu-check: step 9 skipped (under 150 s of the budget left)"
fi

[ $fail = 0 ] && echo "gpu-check: all steps passed" || echo "gpu-check: FAILED (logs in $BUILD/gpu-*.log)"
exit $fail

#!/bin/sh
# Runs the libFuzzer harnesses built by `make fuzz-build` (called by `make fuzz`).
#   FUZZ_BUILD=build-fuzz FUZZ_SECONDS=30 sh tests/fuzz/run.sh [name ...]
# Each harness first replays its committed regression inputs
# (tests/fuzz/regress/NAME/, crashes found and fixed earlier), then fuzzes
# for FUZZ_SECONDS seconds, single process (-jobs=1), starting from the
# committed seeds (tests/fuzz/corpus/NAME, read-only) and the local corpus
# in FUZZ_BUILD/corpus/NAME (new inputs go there). Crashes, leaks, timeouts
# and failed checks are written to FUZZ_BUILD/artifacts/ and make the script
# exit non-zero. FUZZ_FLAGS adds libFuzzer flags (e.g. -runs=N).
set -u
B=${FUZZ_BUILD:-build-fuzz}
S=${FUZZ_SECONDS:-30}
D=tests/fuzz
[ $# -gt 0 ] || set -- $(ls $D/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||')
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
mkdir -p "$B/artifacts" "$B/logs"
failed=""
for n in "$@"; do
  bin="$B/fuzz_$n"
  [ -x "$bin" ] || { echo "fuzz: $bin missing (make fuzz-build)"; failed="$failed $n"; continue; }
  case $n in
    tokenizer_load) len=65536 ;;
    safetensors|template|oai_req|http) len=16384 ;;
    *) len=4096 ;;
  esac
  dict="$B/$n.dict"
  cat $D/dict/json.dict > "$dict"
  [ -f "$D/dict/$n.dict" ] && cat "$D/dict/$n.dict" >> "$dict"
  if [ -d "$D/regress/$n" ] && [ -n "$(ls -A "$D/regress/$n")" ]; then
    if ! "$bin" -timeout=20 -rss_limit_mb=4096 "$D/regress/$n"/* > "$B/logs/$n.regress.log" 2>&1; then
      echo "fuzz: $n: a regression input fails again (see $B/logs/$n.regress.log)"
      tail -40 "$B/logs/$n.regress.log"
      failed="$failed $n"
      continue
    fi
  fi
  mkdir -p "$B/corpus/$n"
  log="$B/logs/$n.log"
  # shellcheck disable=SC2086
  "$bin" -max_total_time="$S" -timeout=20 -rss_limit_mb=4096 -max_len=$len -dict="$dict" -print_final_stats=1 \
    -artifact_prefix="$B/artifacts/$n-" ${FUZZ_FLAGS:-} "$B/corpus/$n" "$D/corpus/$n" > "$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    echo "fuzz: $n: FAILED (exit $rc) after ${execs:-?} runs; log $log"
    grep -E "ERROR|SUMMARY|fuzz check failed|Test unit written|runtime error" "$log" | head -20
    failed="$failed $n"
  else
    echo "fuzz: $n: ok, ${execs:-?} runs in ${S}s (${rate:-?}/s, $cov)"
  fi
done
if [ -n "$failed" ]; then
  echo "fuzz: failed:$failed"
  exit 1
fi
echo "fuzz: all passed"

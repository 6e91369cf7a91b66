#!/bin/sh
# Runs every C test binary, then the pytest suite if present, and prints one
# closing "N passed, N failed" line (the CI reads it).
BUILD=${BUILD:-build}
passed=0; failed=0
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  # TANDEM_TESTS: a space-separated list of test names to run (default: all)
  if [ -n "$TANDEM_TESTS" ]; then case " $TANDEM_TESTS " in *" $(basename "$t") "*) ;; *) continue ;; esac; fi
  out=$("$t" 2>&1); rc=$?
  echo "$out" | tail -n 30
  line=$(echo "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  p=$(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  [ -n "$p" ] || p=0; [ -n "$f" ] || f=0
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; echo "$t exited with $rc"; fi
  passed=$((passed + p)); failed=$((failed + f))
done
if [ -d tests/py ] && ls tests/py/test_*.py >/dev/null 2>&1 && [ -z "$TANDEM_SKIP_PY" ]; then
  sh tests/py/run.sh "$BUILD" > "$BUILD/pytest.log" 2>&1; rc=$?
  tail -n 40 "$BUILD/pytest.log"
  line=$(grep -E '(passed|failed)' "$BUILD/pytest.log" | tail -n 1)
  p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' | head -n 1)
  # failed + errors, summed in sh arithmetic ("2 failed, 1 error" -> 3)
  f=0
  for n in $(echo "$line" | grep -oE '[0-9]+ (failed|errors?)' | grep -oE '[0-9]+'); do f=$((f + n)); done
  [ -n "$p" ] || p=0
  if [ $rc -ne 0 ] && [ "$f" = 0 ]; then f=1; echo "pytest exited with $rc"; fi
  passed=$((passed + p)); failed=$((failed + f))
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]

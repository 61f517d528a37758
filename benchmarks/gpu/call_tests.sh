#!/usr/bin/env bash
# A short device call after a first one (benchmarks/gpu/README.md, "A short loan"): the gpu-marked tests of
# the files named by FILES (default: all), the tests without the gpu marker (not slow) with each result as it
# comes and a JUnit report, then benchmarks/gpu/ks_cuda.py. Writes tests2.log, junit.xml, ks.log to $OUT.
set -uo pipefail
BUDGET=${BUDGET:-180}
source benchmarks/gpu/env.sh || exit 1
PYT=(python3 -m pytest -p no:cacheprovider --continue-on-collection-errors -rfE --tb=short --timeout=100 -n 15)
say "gpu-marked tests: ${FILES:-all}" | tee "$OUT/tests2.log"
timeout -s INT -k 20 "$(cap 45 130)" "${PYT[@]}" -q -m gpu ${FILES:-} >>"$OUT/tests2.log" 2>&1
echo "pytest -m gpu exit status $?" >>"$OUT/tests2.log"
say "tests without the gpu marker, not slow" | tee -a "$OUT/tests2.log"
timeout -s INT -k 25 "$(cap 140 45)" "${PYT[@]}" -v --dist load -m 'not gpu and not slow' --junitxml="$OUT/junit.xml" \
  >>"$OUT/tests2.log" 2>&1
echo "pytest -m 'not gpu and not slow' exit status $?" >>"$OUT/tests2.log"
if (($(left) > 25)); then
  timeout "$(cap 40 5)" python3 benchmarks/gpu/ks_cuda.py >"$OUT/ks.log" 2>&1
fi
say "call done ($(left) s left)" | tee -a "$OUT/tests2.log"
grep -E "exit status|passed|failed" "$OUT/tests2.log" | tail -6
grep -E "^(FAILED|ERROR)" "$OUT/tests2.log" | head -40
cat "$OUT/ks.log" 2>/dev/null | head -20

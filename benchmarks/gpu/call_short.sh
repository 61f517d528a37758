#!/usr/bin/env bash
# One device call for a loan of 15 minutes (benchmarks/gpu/README.md, "A short loan"): call 1's measurements
# re-ordered to fit one call of at most 600 s with the machine's start: the CUDA tests (the gpu-marked first,
# then the rest) beside the torchrun checks, the eager throughput tables with train() against its loop, the
# CUDA-graph table, the KL of 10^7 gate pairs, select_variables at p = 100,000, then the compiled graphs and
# LeNet-5's graphs while time is left. Writes call1.md, tests.log, bench.log, ddp.log to $OUT.
set -uo pipefail
BUDGET=${BUDGET:-560}
source benchmarks/gpu/env.sh || exit 1
MD=$OUT/call1.md
machine_info 2>&1 | tee "$MD"

# 1. Tests: the gpu-marked CUDA variants first, then everything else (default and slow), on 12 workers,
#    in the background while the torchrun checks run.
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12 --dist loadfile" || echo "")
PYT=(python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -rfE --timeout=150)
[ "${SKIP_TESTS:-0}" = 1 ] && PYT=(true)  # (to try the script's flow elsewhere)
(
  timeout -s INT -k 10 "$(cap 60 300)" "${PYT[@]}" -m gpu $XDIST >"$OUT/tests.log" 2>&1
  echo "pytest -m gpu exit status $?" >>"$OUT/tests.log"
  timeout -s INT -k 10 "$(cap 150 280)" "${PYT[@]}" -m 'not gpu' $XDIST --durations=15 >>"$OUT/tests.log" 2>&1
  echo "pytest -m 'not gpu' exit status $?" >>"$OUT/tests.log"
) &
TESTS_PID=$!
ddp_checks 100 120 >"$OUT/ddp.log" 2>&1
grep -h "DDP_RESULT\|Error\|error" "$OUT/ddp.log" | head -20 | tee -a "$MD"
wait "$TESTS_PID"
{
  say "tests: summary"
  grep -E "passed|failed|exit status" "$OUT/tests.log" | tail -6
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -60
} 2>&1 | tee -a "$MD"

# 2. Eager throughput, data resident on the GPU, and train() against its bare loop.
for spec in "mlp 100" "mlp 1000" "lenet5 100" "lenet5 1000"; do
  set -- $spec
  C=$(cap 35 140)
  say "bench_training --model $1 --batch-size $2 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_training.py --device cuda --model "$1" --batch-size "$2" --repeats 3 --steps 100 \
    --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | grep -v "^  repeat" | tail -12 >>"$MD"
done
# 3. CUDA graphs of the MLP's steps at batch 100 (eager beside).
C=$(cap 50 90)
say "bench_training --cuda-graph, MLP, batch 100 (cap $C s)" | tee -a "$MD"
timeout "$C" python3 benchmarks/bench_training.py --device cuda --model mlp --batch-size 100 --cuda-graph \
  --repeats 3 --steps 600 --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | tail -14 >>"$MD"
# 4. The KL (and rsample, log_prob) of 10^7 gate pairs, float32 with peak memory, then float64.
C=$(cap 35 55)
say "bench_distribution --sizes 1e7 --dtype float32 (cap $C s)" | tee -a "$MD"
timeout "$C" python3 benchmarks/bench_distribution.py --device cuda --sizes 1e7 --dtype float32 --markdown \
  2>&1 | tee -a "$OUT/bench.log" | tail -9 >>"$MD"
# 5. select_variables at p = 100,000 on CUDA and on the 16 CPU threads.
C=$(cap 55 5)
say "select_large --p 100000 (cap $C s)" | tee -a "$MD"
OMP_NUM_THREADS=16 timeout "$C" python3 benchmarks/gpu/select_large.py --p 100000 --devices cuda cpu --threads 16 \
  2>&1 | tee -a "$OUT/bench.log" | tail -8 >>"$MD"
# 6. While time is left: float64 KL, the graphs of the compiled losses, LeNet-5's graphs.
if (($(left) > 45)); then
  C=$(cap 20 20)
  say "bench_distribution --sizes 1e7 --dtype float64 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_distribution.py --device cuda --sizes 1e7 --dtype float64 --markdown --no-memory \
    2>&1 | tee -a "$OUT/bench.log" | tail -9 >>"$MD"
fi
if (($(left) > 60)); then
  C=$(cap 150 15)
  say "bench_training --cuda-graph --graph-compile, MLP, batch 100 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_training.py --device cuda --model mlp --batch-size 100 --cuda-graph --graph-compile \
    --repeats 3 --steps 600 --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | tail -16 >>"$MD"
fi
if (($(left) > 45)); then
  C=$(cap 60 15)
  say "bench_training --cuda-graph --model lenet5 --batch-size 100 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_training.py --device cuda --model lenet5 --batch-size 100 --cuda-graph --repeats 3 \
    --steps 300 --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | tail -8 >>"$MD"
fi
say "call done ($(left) s of the budget left)" | tee -a "$MD"
cat "$MD"

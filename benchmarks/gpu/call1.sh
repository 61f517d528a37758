#!/usr/bin/env bash
# Device call 1 of the GPU runs (benchmarks/gpu/README.md): the test suite on CUDA, the throughput tables
# (eager and CUDA graphs), the KL of 10^7 gate pairs, select_variables at p = 100,000, and data-parallel
# training under torchrun with checkpoint and resume. Everything goes to $OUT: call1.md (machine, the
# tables, each step's tail), tests.log, bench.log, ddp.log. Each step has its own time limit, and the
# call stops starting steps when its BUDGET (seconds, default 520 of the tool's 600) runs short.
set -uo pipefail
BUDGET=${BUDGET:-520}
source benchmarks/gpu/env.sh || exit 1
MD=$OUT/call1.md
{
  machine_info
  nvidia-smi -L
  command -v nvidia-cuda-mps-control >/dev/null && echo "nvidia-cuda-mps-control: present" || echo "nvidia-cuda-mps-control: absent"
} 2>&1 | tee "$MD"

# 1. The whole suite (default, slow and gpu markers: -m '' overrides the default 'not slow and not gpu'),
#    in the background on 12 xdist workers, while the data-parallel check runs (neither is timed).
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12 --dist loadfile" || echo "")
PER_TEST=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout=180" || echo "")
TESTS_CAP=$(cap 200 300)
say "tests: python3 -m pytest -m '' $XDIST (cap ${TESTS_CAP} s)" | tee -a "$MD"
[ "${SKIP_TESTS:-0}" = 1 ] && TESTS_CAP=1  # (to try the script's flow elsewhere)
(timeout -s INT -k 15 "$TESTS_CAP" python3 -m pytest -q -m '' -p no:cacheprovider --continue-on-collection-errors $XDIST -rfEs --durations=25 \
  $PER_TEST >"$OUT/tests.log" 2>&1; echo "pytest exit status $?" >>"$OUT/tests.log") &
TESTS_PID=$!

# 2. Data-parallel on CUDA: the CLI under torchrun (one process: fit, then --resume), train() under
#    torchrun with checkpoint and resume (1 process; then 2 ranks with gloo on the one GPU), a DDP step on nccl.
ddp_checks 120 150 >"$OUT/ddp.log" 2>&1
grep -h "DDP_RESULT\|Error\|error" "$OUT/ddp.log" | head -20 | tee -a "$MD"
wait "$TESTS_PID"
{
  say "tests: summary"
  grep -E "passed|failed|error|pytest exit status" "$OUT/tests.log" | tail -5
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -60
} 2>&1 | tee -a "$MD"

# 3. Throughput (GPU to itself from here on): eager steps, data resident on the GPU, ratios to dense.
for spec in "mlp 100" "mlp 1000" "lenet5 100" "lenet5 1000"; do
  set -- $spec
  C=$(cap 45 200)
  say "bench_training --model $1 --batch-size $2 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_training.py --device cuda --model "$1" --batch-size "$2" --repeats 3 --steps 100 \
    --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | grep -v "^  repeat" | tail -14 >>"$MD"
done
# 4. CUDA graphs (and the compiled loss inside a graph) for the MLP at batch 100: the >= 1M images/s target.
C=$(cap 130 90)
say "bench_training --cuda-graph --graph-compile, MLP, batch 100 (cap $C s)" | tee -a "$MD"
timeout "$C" python3 benchmarks/bench_training.py --device cuda --model mlp --batch-size 100 --cuda-graph --graph-compile \
  --repeats 3 --steps 600 --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | tail -16 >>"$MD"

# 5. KL (and rsample, log_prob, prob_nonzero) of 10^7 gate pairs: float32 with peak memory (a fresh process
#    per op), float64 without.
for spec in "float32 45" "float64 25"; do
  set -- $spec
  C=$(cap "$2" 60)
  say "bench_distribution --sizes 1e7 --dtype $1 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_distribution.py --device cuda --sizes 1e7 --dtype "$1" --markdown \
    $([ "$1" = float64 ] && echo --no-memory) 2>&1 | tee -a "$OUT/bench.log" | tail -9 >>"$MD"
done
# 6. select_variables at p = 100,000 (n = 1000, rho 0.5, 20 effects) on CUDA and on the 16 CPU cores.
C=$(cap 60 10)
say "select_large --p 100000 (cap $C s)" | tee -a "$MD"
OMP_NUM_THREADS=16 timeout "$C" python3 benchmarks/gpu/select_large.py --p 100000 --devices cuda cpu --threads 16 \
  2>&1 | tee -a "$OUT/bench.log" | tail -8 >>"$MD"
# 7. If time is left: the graph table at batch 1000 and for LeNet-5.
for spec in "mlp 1000" "lenet5 100"; do
  set -- $spec
  (($(left) > 70)) || break
  C=$(cap 60 25)
  say "bench_training --cuda-graph --model $1 --batch-size $2 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_training.py --device cuda --model "$1" --batch-size "$2" --cuda-graph --repeats 3 \
    --steps 300 --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | tail -8 >>"$MD"
done
# 8. If time is left: train(compile=True)'s step (Triton kernels) against eager, MLP, batch 100.
if (($(left) > 90)); then
  C=$(cap 150 20)
  say "bench_training --compile, MLP, batch 100 (cap $C s)" | tee -a "$MD"
  timeout "$C" python3 benchmarks/bench_training.py --device cuda --model mlp --compile --repeats 3 --steps 300 \
    --markdown --data-dir "$FMNIST" 2>&1 | tee -a "$OUT/bench.log" | tail -10 >>"$MD"
fi
say "call 1 done ($(left) s of the budget left)" | tee -a "$MD"
cat "$MD"

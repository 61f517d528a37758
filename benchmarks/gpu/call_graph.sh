#!/usr/bin/env bash
# One device call for a loan of 15 minutes (benchmarks/gpu/README.md, "The paper's runs with CUDA graphs"): the
# CUDA-graph tests, then the paper's 200-epoch runs (every run of calls 2 and 3, 3 seeds) as graphed processes
# side by side (MPS when MPS=1), then train(cuda_graph=True) against eager and whole-step graphs on the idle GPU.
# Writes call_graph.md, tests.log, train_graph.log and the paper runs' files (paper_call.sh) to $OUT.
set -uo pipefail
BUDGET=${BUDGET:-560}
BENCH_S=${BENCH_S:-75}  # kept for train_graph.py after the paper runs
source benchmarks/gpu/env.sh || exit 1
MD=$OUT/call_graph.md
machine_info 2>&1 | tee "$MD"
# 1. The graphed step against the eager one, and train(cuda_graph=True) with resume, on CUDA.
say "pytest tests/test_graphed.py -m gpu" | tee -a "$MD"
timeout -s INT -k 5 "$(cap 50 120)" python3 -m pytest -q -p no:cacheprovider -rfE -m gpu tests/test_graphed.py \
  >"$OUT/tests.log" 2>&1
echo "exit status $?" >>"$OUT/tests.log"
grep -E "passed|failed|^(FAILED|ERROR)|exit status" "$OUT/tests.log" | tail -12 | tee -a "$MD"
# 2. The paper's runs, every job with --cuda-graph, until BENCH_S + 55 s before the end.
RUNS=${RUNS:-mlp lenet5 mlp-bayes lenet5-bayes mlp-sep lenet5-sep mlp-constrained lenet5-constrained lenet5-noema mlp-dense lenet5-dense}
paper_runs graph $((55 + BENCH_S)) ${GRAPH---cuda-graph} --runs $RUNS
{
  say "one graphed job's log"
  tail -5 runs/gpu-paper/mlp-s0.log 2>/dev/null
  grep -l "could not be captured" runs/gpu-paper/*.log 2>/dev/null | head
} >>"$MD" 2>&1
# 3. train(cuda_graph=True) on the idle GPU: s/epoch against the whole-step graphs and the dense graph.
C=$(cap "$BENCH_S" 45)
say "train_graph.py --protocol --epochs 4 (cap $C s)" | tee -a "$MD"
timeout "$C" python3 benchmarks/gpu/train_graph.py --protocol --epochs 4 --data-dir "$FMNIST" >"$OUT/train_graph.log" 2>&1
tail -8 "$OUT/train_graph.log" >>"$MD"
paper_pack graph
say "done ($(left) s of the budget left)" | tee -a "$MD"
head -60 "$OUT/paper_summary.md" 2>/dev/null

#!/usr/bin/env bash
# One device call of the paper's 200-epoch runs (benchmarks/gpu/README.md): call2.sh and call3.sh name the runs.
#   bash benchmarks/gpu/paper_call.sh NAME RUN...
# Runs benchmarks/gpu/paper_runs.py on RUN... x seeds 0 1 2 into runs/gpu-paper (kept on the machine while
# it stays warm: a later call continues unfinished L0 runs from their checkpoints and skips finished jobs),
# stops them at the call's deadline, and writes to $OUT: NAME.md (machine, GPU use every 15 s, scheduler
# log), NAME.scheduler (its per-poll progress), paper_summary.md, per_epoch.csv, paper_per_epoch.png (benchmarks/gpu/summarize.py over every job
# in runs/gpu-paper so far) and paper-runs-NAME.tar.gz (every job's history, summary, log; no .pt files).
set -uo pipefail
BUDGET=${BUDGET:-540}
NAME=$1
shift
source benchmarks/gpu/env.sh || exit 1
MD=$OUT/$NAME.md
{
  say "$NAME: $*"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'CPUs', __import__('os').cpu_count())"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?'); date $(date -u +%F' '%H:%M) UTC; MPS=${MPS:-0}"
} 2>&1 | tee "$MD"
paper_runs "$NAME" 55 --runs "$@"
paper_pack "$NAME"
say "$NAME done ($(left) s of the budget left)" | tee -a "$MD"
cat "$OUT/paper_summary.md" 2>/dev/null | head -40

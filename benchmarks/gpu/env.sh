# Sourced by every call script of benchmarks/gpu at the start of a device call (bash, repository root).
# Installs the carried wheels (.whl, made here by wheels.sh), puts the carried Fashion-MNIST (.gpudata) where
# l0bayes.data.find_fashion_mnist() looks (the commands run as root there), sets one thread per process and
# the clock of the call. Returns non-zero (and says why) when something the call needs is missing.
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }     # seconds left of the call's BUDGET
cap() { local l; l=$(($(left) - ${2:-20})); ((l < $1)) && echo $((l > 5 ? l : 5)) || echo "$1"; }  # min(cap, left - reserve)
say() { echo "### [$(($(date +%s) - T0)) s] $*"; }
if [ -z "${OUT:-}" ]; then echo "OUT is not set: run this through the device tool" >&2; return 1; fi
if ! ls .whl/*.whl >/dev/null 2>&1; then echo "no .whl/: run benchmarks/gpu/wheels.sh here and carry .whl" >&2; return 1; fi
if [ ! -f .gpudata/fashion-mnist/train-images-idx3-ubyte.gz ]; then echo "no .gpudata/: carry it (wheels.sh)" >&2; return 1; fi
# DRYRUN=1 (to try the scripts on a machine without CUDA, with DEVICE=cpu): no CUDA check, no system folder.
SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
  2>&1 | grep -v "WARNING: Target directory" || true
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MPLBACKEND=Agg
export FMNIST=$PWD/.gpudata/fashion-mnist
if [ "${DRYRUN:-0}" != 1 ]; then
  mkdir -p /usr/share/datasets/fashion-mnist 2>/dev/null && cp -n "$FMNIST"/*.gz /usr/share/datasets/fashion-mnist/ 2>/dev/null
fi
python3 -c "import torch, pyro, l0bayes, os; assert torch.cuda.is_available() or os.environ.get('DRYRUN') == '1', 'no CUDA'" || {
  echo "python3 cannot import torch with CUDA, pyro and l0bayes" >&2
  return 1
}
# MPS=1 in the command: run the call's processes as clients of an MPS daemon, so that the small kernels of
# many training processes run side by side on the GPU instead of time-sliced. No card setting changes (the
# compute mode stays as found); the daemon is stopped at the end of the call. Falls back to plain sharing.
mps_start() {
  [ "${MPS:-0}" = 1 ] || return 0
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d &&
    timeout 60 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
    say "MPS daemon started"
  else
    say "MPS not available: plain time-sliced sharing"
    echo quit | nvidia-cuda-mps-control 2>/dev/null
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  fi
}
mps_stop() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control 2>/dev/null
  true
}
# Data-parallel training on CUDA (calls 1 and short): the CLI under torchrun (one process: fit, then --resume),
# train() under torchrun with checkpoint and resume (1 process with a one-rank nccl DDP step; then 2 ranks with
# gloo on the one GPU). $1: seconds each one-process command may take, $2: the two-rank one. Writes to stdout.
ddp_checks() {
  rm -rf runs/gpu-ddp && mkdir -p runs/gpu-ddp
  say "torchrun, 1 process: l0bayes fit (1 epoch), then --resume to 2 epochs"
  local fit=(-m l0bayes fit --model mlp --data fashion-mnist --data-dir "$FMNIST" --batch-size 100 --lr 1e-3 --device cuda --out runs/gpu-ddp/cli --no-progress --threads 1)
  timeout "$1" torchrun --standalone --nproc_per_node=1 "${fit[@]}" --epochs 1 | tail -12
  timeout "$1" torchrun --standalone --nproc_per_node=1 "${fit[@]}" --epochs 2 --resume | tail -12
  say "torchrun, 1 process: train() with checkpoint and resume, and a DDP step in a one-rank nccl group"
  timeout "$1" torchrun --standalone --nproc_per_node=1 benchmarks/gpu/ddp_cuda.py --ddp-step --data-dir "$FMNIST" --out runs/gpu-ddp/one
  say "torchrun, 2 ranks on the one GPU (gloo): train() with checkpoint and resume"
  timeout "$2" torchrun --standalone --nproc_per_node=2 benchmarks/gpu/ddp_cuda.py --backend gloo --data-dir "$FMNIST" --out runs/gpu-ddp/two
}
# The machine, for the head of a call's markdown (GPU as nvidia-smi names it, versions, CPU, commit, date).
machine_info() {
  say "machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, pyro, platform; print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'pyro', pyro.__version__, torch.cuda.get_device_name(0))"
  echo "CPUs: $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l) changed files; date $(date -u +%F' '%H:%M) UTC"
}
# The paper's runs (paper_runs.py into runs/gpu-paper) until $2 seconds before the call's end, GPU use sampled
# every 15 s, under MPS when MPS=1: paper_runs NAME RESERVE [paper_runs.py options, e.g. --runs ...]. Writes
# $OUT/NAME.scheduler and appends the scheduler's last lines and the GPU samples to $MD.
paper_runs() {
  local name=$1 reserve=$2 smi deadline
  shift 2
  mps_start 2>&1 | tee -a "$MD"
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 15 >"$OUT/$name.gpu" 2>&1 &
  smi=$!
  deadline=$(($(left) - reserve))
  say "paper_runs.py $* --deadline $deadline" | tee -a "$MD"
  python3 benchmarks/gpu/paper_runs.py "$@" --deadline "$deadline" --data-dir "$FMNIST" --root runs/gpu-paper \
    --device "${DEVICE:-cuda}" --epochs "${EPOCHS:-200}" --seeds ${SEEDS:-0 1 2} >"$OUT/$name.scheduler" 2>&1
  kill "$smi" 2>/dev/null
  mps_stop
  {
    say "scheduler (last lines)"
    grep -v "^\[" "$OUT/$name.scheduler" | tail -20
    grep "^\[" "$OUT/$name.scheduler" | tail -3
    say "GPU utilisation and memory every 15 s"
    cat "$OUT/$name.gpu"
  } >>"$MD" 2>&1
  rm -f "$OUT/$name.gpu"
}
# Tables, CSV and figure of every job in runs/gpu-paper (summarize.py), and their files without checkpoints:
# paper_pack NAME writes paper_summary.md, per_epoch.csv, paper_per_epoch.png, paper-runs-NAME.tar.gz to $OUT.
paper_pack() {
  timeout 60 python3 benchmarks/gpu/summarize.py runs/gpu-paper --epochs "${EPOCHS:-200}" --out "$OUT" >/dev/null 2>>"$MD"
  tar czf "$OUT/paper-runs-$1.tar.gz" --exclude='*.pt' -C runs gpu-paper
}

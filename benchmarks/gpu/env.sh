# Sourced by call1.sh, call2.sh, call3.sh at the start of every device call (bash, repository root).
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

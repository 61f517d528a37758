#!/usr/bin/env bash
# Device call 2 of the GPU runs (benchmarks/gpu/README.md): the MLP runs, 3 seeds, 200 epochs, in priority order,
# then LeNet-5 with the paper script's own settings (no parameter averaging) if the GPU has room.
exec bash benchmarks/gpu/paper_call.sh call2 ${RUNS:-mlp mlp-bayes mlp-sep mlp-dense mlp-constrained lenet5-noema}

#!/usr/bin/env bash
# Device call 3 of the GPU runs (benchmarks/gpu/README.md): the LeNet-5 runs, 3 seeds, 200 epochs, in priority order.
# On a machine still warm from call 2 the summary covers both calls' jobs.
exec bash benchmarks/gpu/paper_call.sh call3 ${RUNS:-lenet5 lenet5-bayes lenet5-sep lenet5-dense lenet5-constrained}

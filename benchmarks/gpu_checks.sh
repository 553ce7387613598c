#!/usr/bin/env bash
# The GPU checks in one run, for a machine with one CUDA GPU: the tests marked gpu (the host-sync
# guard counted by torch's own sync check among them), a batch too large for the GPU's memory
# split into micro-batches and finished (its figures in out_of_memory.txt), then
# benchmarks/overhead.py on the GPU in 32-true (the tiny MLP, seed 003's CNN and the transformer,
# eager and compiled), in bf16-mixed (the CNN and the transformer), and what each of fit's
# features costs. Each step has a time limit and writes a file of its own in the folder given, so
# a run cut short keeps what it finished; the summary at the end is what docs/performance.md's
# "On a GPU" section reports.
#
#     bash benchmarks/gpu_checks.sh [folder]     # default folder: gpu-results; at most 13 minutes
#
# Run it from the repository's root. Python's own torch is used as it is (install the project, or
# put the checkout on PYTHONPATH).
set -u
out=${1:-gpu-results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

{
    nvidia-smi -L
    python -c "import torch, accelerate, torchmetrics; print('torch', torch.__version__, 'accelerate', accelerate.__version__, 'torchmetrics', torchmetrics.__version__)"
} >"$out/env.txt" 2>&1

gpu_test_files=$(grep -rl --include="test_*.py" "mark.gpu\|needs_cuda" tests | grep -v test_out_of_memory.py)
timeout 240 python -m pytest -m gpu -p no:cacheprovider -q -rs $gpu_test_files >"$out/gpu_tests.txt" 2>&1
echo "pytest exit status $?" >>"$out/gpu_tests.txt"

# A real CUDA out of memory (a batch of 128 large images under a 1.5 GiB cap): fit splits it and
# finishes as the uncapped run does; -rP prints the figures the test measured.
timeout 60 python -m pytest -m gpu -p no:cacheprovider -q -rsP tests/training/test_out_of_memory.py >"$out/out_of_memory.txt" 2>&1
echo "pytest exit status $?" >>"$out/out_of_memory.txt"

# overhead.py prints its tables on stdout and the loops' own output (progress bars) on stderr.
overhead() {
    local limit=$1 file=$2
    shift 2
    timeout "$limit" python benchmarks/overhead.py --epochs 3 "$@" >>"$out/$file" 2>>"$out/overhead_stderr.txt"
    echo "exit status $? (overhead.py $*)" >>"$out/$file"
}
overhead 200 overhead_32.txt --repeats 3
overhead 80 overhead_bf16.txt --repeats 3 --precision bf16-mixed --only cnn
overhead 100 overhead_bf16.txt --repeats 2 --precision bf16-mixed --only transformer
overhead 120 features.txt --repeats 3 --only features

cat "$out/env.txt"
tail -n 3 "$out/gpu_tests.txt"
grep -hE "^out of memory on |passed|failed|skipped|exit status" "$out/out_of_memory.txt"
grep -hE "^(tiny|seed 003|transformer|\(d\)|loop|bare|seed loop|fit|\+ |\(fit compile|exit status)" \
    "$out/overhead_32.txt" "$out/overhead_bf16.txt" "$out/features.txt"

#!/usr/bin/env bash
# The CUDA checks in one run: the tests that need a GPU (CUDA tensors, compiled Triton
# kernels, CUDA graphs, CuPy), then the GPU rows of the maintainers' harness
# (python -m benchmarks --gpu). Each step has its own time limit so that one slow step
# cannot take the others' time. Logs go to $OUT (default ./out).
#   bash tools/gpu_checks.sh [TEST_SECONDS] [BENCH_SECONDS] [BENCH ROW KEYS...]
# TEST_SECONDS or BENCH_SECONDS 0 skips that step; AMOPT_TEST_WORKERS (default 8) runs the
# tests in that many pytest-xdist workers where pytest-xdist is installed; AMOPT_PROFILE_S
# (default 0: none) gives tools/gpu_profile.py's train and compiled profiles that many
# seconds each, after the bench.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# a9a for the sparse rows and tests, where a copy travels with the tree
if [ -f .gpudata/a9a ]; then
    mkdir -p ../shared/data/libsvm && cp .gpudata/a9a ../shared/data/libsvm/a9a
    export AMOPT_A9A="$PWD/.gpudata/a9a"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)" | tee -a "$out/gpu.txt"

workers=()
if python3 -c "import xdist" 2>/dev/null && [ "${AMOPT_TEST_WORKERS:-8}" -gt 1 ]; then
    workers=(-n "${AMOPT_TEST_WORKERS:-8}")
fi
test_s="${1:-150}"; bench_s="${2:-170}"; shift 2 2>/dev/null || shift $#
[ "$test_s" -gt 0 ] && timeout "$test_s" python3 -m pytest -v -p no:cacheprovider -rfEs \
    --tb=short --durations=15 --timeout 120 "${workers[@]}" \
    tests/test_triton.py tests/test_triton_compile.py tests/test_triton_driver.py \
    tests/test_triton_cuda.py tests/test_torch_foreach_structure.py \
    tests/test_torch_optim_renewed.py \
    "tests/test_minimize_device_syncs.py" "tests/test_problems_sparse_device.py" \
    tests/test_minimize_pipelined.py tests/test_cupy_rule.py tests/test_cupy_apply.py tests/test_cupy_logistic.py \
    tests/test_torch_triton_rule.py \
    -k "cuda or cupy or triton or Triton or gpu" 2>&1 | tee "$out/tests.log" \
    | grep -v -E " PASSED| SKIPPED|^\[gw" | tail -60
echo "tests exit: ${PIPESTATUS[0]}"

rows=()
[ $# -gt 0 ] && rows=(--rows "$@")
[ "$bench_s" -gt 0 ] && timeout "$bench_s" python3 -m benchmarks --gpu --row-seconds 2 \
    "${rows[@]}" --json "$out/bench.json" \
    2>&1 | tee "$out/bench.log" | tail -45
echo "bench exit: ${PIPESTATUS[0]}"

profile_s="${AMOPT_PROFILE_S:-0}"
if [ "$profile_s" -gt 0 ]; then
    for part in train compiled; do
        timeout "$profile_s" python3 tools/gpu_profile.py "$part" > "$out/profile-$part.log" 2>&1
        echo "profile $part exit: $?"
        grep -E "^(train|kept|grads|compiled) " "$out/profile-$part.log"
    done
fi

#!/usr/bin/env bash
# Runs the GPU tests that cover every kernel (forward, reduction, the 64-bit offset path) and
# every input stride kind under compute-sanitizer: memcheck, racecheck and initcheck. Any
# error reported by a tool fails the run.
#
#   bash tests/compute_sanitizer.sh [log-dir]
#
# Needs a CUDA GPU and compute-sanitizer on PATH (CUDA toolkit). PyTorch's caching allocator
# is off so that memcheck sees every out-of-bounds access, not only those past a cached block.
set -euo pipefail
cd "$(dirname "$0")/.."
logs="${1:-sanitizer-logs}"
mkdir -p "$logs"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 NEURALOPS_GQA_BACKEND=triton
subset=(
    tests/test_expand.py tests/test_reduce_autograd.py tests/test_kernels.py
    -k "(layouts or every_dtype or mixed or empty or special or reads_stay or group_sizes or int64 or compiled_handle or strides) and not torch"
    -q -p no:cacheprovider
)
status=0
for tool in memcheck racecheck initcheck; do
    echo "== $tool"
    rc=0
    compute-sanitizer --tool "$tool" --error-exitcode 97 --print-limit 50 \
        python -m pytest "${subset[@]}" >"$logs/$tool.log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "$tool: no errors ($(grep -Eo '[0-9]+ passed' "$logs/$tool.log" | tail -1))"
    else
        status=1
        echo "$tool: FAILED (exit $rc; 97 = errors found), see $logs/$tool.log"
        grep -E "Invalid|Race|Uninitialized|passed|failed" "$logs/$tool.log" | head -5 || true
    fi
    grep -E "ERROR SUMMARY" "$logs/$tool.log" | tail -1 || true
done
# Heads of 2^31 elements in a 2-D layout (the 64-bit products of two scalars): memcheck only,
# the tensors are several GiB.
echo "== memcheck, huge heads"
rc=0
compute-sanitizer --tool memcheck --error-exitcode 97 --print-limit 50 \
    python -m pytest tests/test_large.py -k "(huge or head_stride) and triton" -q -p no:cacheprovider \
    >"$logs/memcheck-huge.log" 2>&1 || rc=$?
grep -Eo '[0-9]+ (passed|failed|skipped)' "$logs/memcheck-huge.log" | tr '\n' ' ' || true
grep -E "ERROR SUMMARY" "$logs/memcheck-huge.log" | tail -1 || true
[ "$rc" -eq 0 ] || status=1
exit "$status"

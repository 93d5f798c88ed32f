#!/usr/bin/env bash
# The GPU checks that CI can't run, in stages, each writing a log under OUT:
#
#   bash tests/gpu_check.sh OUT suite       # the whole test suite on the GPU (CUDA picked by the tests)
#   bash tests/gpu_check.sh OUT sanitizer   # tests/compute_sanitizer.sh
#   bash tests/gpu_check.sh OUT host        # eager host cost, private fast paths on and off, step by step
#                                           # (one call's steps, and an eager attention block's)
#
# Run from the repository root on a machine with a CUDA GPU; the package is used in place.
set -uo pipefail
cd "$(dirname "$0")/.."
out="$1"
shift
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
for stage in "$@"; do
    start=$(date +%s)
    case "$stage" in
    suite)
        # One pytest per test file, eight at a time (most of the time is compilation, on the
        # CPU); each file's log under OUT/suite/. The gloo DTensor cases run Triton's
        # interpreter on CPU ranks, which triton 3.6 can't do on local shards
        # (docs/usage/limitations.md); NCCL on one rank runs here.
        mkdir -p "$out/suite"
        # SUITE_FILES (space-separated paths) picks the files, all by default; SUITE_TIMEOUT
        # (seconds) bounds each file.
        # shellcheck disable=SC2016,SC2086
        ls ${SUITE_FILES:-tests/test_*.py} | xargs -P 8 -I{} sh -c \
            'timeout ${SUITE_TIMEOUT:-3600} python -m pytest -q -rfE --tb=short --durations=3 -p no:cacheprovider -k "not gloo" "$1" >"$2/$(basename "$1" .py).log" 2>&1' \
            _ {} "$out/suite" || status=1
        for log in "$out"/suite/*.log; do
            printf '%-28s %s\n' "$(basename "$log" .log)" "$(tail -n 1 "$log")"
        done
        grep -h "^FAILED\|^ERROR" "$out"/suite/*.log
        ;;
    sanitizer)
        bash tests/compute_sanitizer.sh "$out/sanitizer" >"$out/sanitizer.txt" 2>&1 || status=1
        cat "$out/sanitizer.txt"
        ;;
    host)
        for private in 1 0; do
            NEURALOPS_GQA_PRIVATE_INTERNALS=$private python -m benchmarks.bench --parts host \
                --shapes small --out "$out/host-private-$private" >"$out/host-private-$private.log" 2>&1 || status=1
            grep -iE "neuralops_gqa|repeat_kv|floor" "$out/host-private-$private.log" | head -8
        done
        # Where one eager call's host time goes, step by step (private internals on).
        python -m benchmarks.call_steps --out "$out/call-steps" >"$out/call-steps.log" 2>&1 || status=1
        cat "$out/call-steps.log"
        # The same for the eager-matmul attention block, each step of it (small case).
        python -m benchmarks.block_stages --out "$out/block-stages" >"$out/block-stages.log" 2>&1 || status=1
        cat "$out/block-stages.log"
        ;;
    *)
        echo "unknown stage $stage" >&2
        exit 2
        ;;
    esac
    echo "== $stage: $(($(date +%s) - start)) s"
done
exit "$status"

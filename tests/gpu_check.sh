#!/usr/bin/env bash
# The GPU checks that CI can't run, in stages, each writing a log under OUT:
#
#   bash tests/gpu_check.sh OUT suite       # the whole test suite on the GPU (CUDA picked by the tests)
#   bash tests/gpu_check.sh OUT sanitizer   # tests/compute_sanitizer.sh
#   bash tests/gpu_check.sh OUT host        # eager host cost, private fast paths on and off
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
        # The gloo DTensor cases run Triton's interpreter on CPU ranks, which triton 3.6 can't
        # do on local shards (docs/usage/limitations.md); NCCL on one rank runs here.
        python -m pytest -q -p no:cacheprovider -k "not gloo" >"$out/suite.log" 2>&1 || status=1
        tail -3 "$out/suite.log"
        ;;
    sanitizer)
        bash tests/compute_sanitizer.sh "$out/sanitizer" >"$out/sanitizer.txt" 2>&1 || status=1
        cat "$out/sanitizer.txt"
        ;;
    host)
        for private in 1 0; do
            NEURALOPS_GQA_PRIVATE_INTERNALS=$private python -m neuralops_gqa.bench --parts host \
                --shapes small --out "$out/host-private-$private" >"$out/host-private-$private.log" 2>&1 || status=1
            grep -iE "neuralops|hf_eager|launcher" "$out/host-private-$private.log" | head -8
        done
        ;;
    *)
        echo "unknown stage $stage" >&2
        exit 2
        ;;
    esac
    echo "== $stage: $(($(date +%s) - start)) s"
done
exit "$status"

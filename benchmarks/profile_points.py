"""Launch the reduction and the expansion once at a few users' shapes, for a profiler.

Under Nsight Compute (the kernels only, caches flushed between them by default)::

    ncu --clock-control none --kernel-name regex:"reduce_bwd_kernel|expand_fwd_kernel" \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
    dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,\\
    sm__maximum_warps_per_active_cycle_pct,launch__grid_size,launch__block_size,\\
    launch__waves_per_multiprocessor,launch__registers_per_thread --csv \\
        python -m benchmarks.profile_points > profile.csv

The points are the kind the users' shapes put under 95% of a same-size copy (MQA's and
Llama-3-70B's backward at short sequences) and two that reach it (Llama-3-8B, long).
CUDA only.
"""

from __future__ import annotations

import sys

import torch

import neuralops_gqa  # noqa: F401  (registers the ops)

# name, direction, batch, KV heads, query heads, sequence, head dim
POINTS: tuple[tuple[str, str, int, int, int, int, int], ...] = (
    ("llama3-70b-bwd-B2-N1000", "bwd", 2, 8, 64, 1000, 128),
    ("llama3-70b-bwd-B4-N1000", "bwd", 4, 8, 64, 1000, 128),
    ("falcon-bwd-B2-N1000", "bwd", 2, 1, 71, 1000, 64),
    ("falcon-bwd-B4-N4095", "bwd", 4, 1, 71, 4095, 64),
    ("llama3-8b-bwd-B8-N4095", "bwd", 8, 8, 32, 4095, 128),
    ("llama3-8b-fwd-B8-N4095", "fwd", 8, 8, 32, 4095, 128),
)


def main() -> None:
    if not torch.cuda.is_available():
        print(
            "python -m benchmarks.profile_points: launches CUDA kernels; there is no GPU here",
            file=sys.stderr,
        )
        raise SystemExit(2)
    for name, direction, batch, kv_heads, heads, seq, dim in POINTS:
        if direction == "fwd":
            k = torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=torch.bfloat16)
            torch.ops.neuralops.gqa_expand(k, torch.randn_like(k), kv_heads, heads)
        else:
            g = torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16)
            torch.ops.neuralops.gqa_reduce(g, torch.randn_like(g), kv_heads, heads)
        torch.cuda.synchronize()
        print(name)


if __name__ == "__main__":
    main()

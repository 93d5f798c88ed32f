"""Launch the reduction or the expansion once at each of ``cases.PROFILE_POINTS``, then a copy
kernel of the same bytes (the reference its DRAM throughput is read against), for a profiler.

Under Nsight Compute (the kernels only, caches flushed between them by default):

    ncu --clock-control none --kernel-name regex:"reduce_bwd_kernel|expand_fwd_kernel|vectorized_elementwise" \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
    dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,\\
    sm__maximum_warps_per_active_cycle_pct,launch__grid_size,launch__block_size,\\
    launch__waves_per_multiprocessor,launch__registers_per_thread --csv \\
        python -m benchmarks.profile_points > profile.csv

CUDA only.
"""

from __future__ import annotations

import sys

import torch

from benchmarks import cli, peers, timing
from benchmarks.cases import PROFILE_POINTS


def main(argv: list[str] | None = None) -> None:
    cli.parser("python -m benchmarks.profile_points", __doc__ or "", []).parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "python -m benchmarks.profile_points: launches CUDA kernels; there is no GPU here",
            file=sys.stderr,
        )
        raise SystemExit(2)
    for direction, shape in PROFILE_POINTS:
        heads = shape.kv_heads if direction == "forward" else shape.heads
        a, b = shape.tensors(torch.bfloat16, "cuda", heads)
        (peers.ours if direction == "forward" else peers.ours_backward)(a, b, shape.n_rep)
        timing.same_size_copies(shape.minimal_bytes(a.element_size()), "cuda")["copy_kernel"][0]()
        torch.cuda.synchronize()
        print(f"{shape.name} {direction}, then the same-size copy")


if __name__ == "__main__":
    main()

"""Peak memory of our forward and backward over the bytes of their results (CUDA only):
1.0 means no workspace beyond the outputs."""

from __future__ import annotations

import torch

from benchmarks import peers
from benchmarks.cases import Shape
from benchmarks.results import Report, Step


def peak_over_results(shape: Shape, dtype: torch.dtype) -> dict[str, float]:
    k, v = shape.tensors(dtype, "cuda")
    ratios = {}
    for direction in ("forward", "backward"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = (
            peers.ours(k, v, shape.n_rep)
            if direction == "forward"
            else peers.ours_backward(k, v, shape.n_rep)
        )
        ratios[direction] = (torch.cuda.max_memory_allocated() - base) / sum(o.nbytes for o in out)
        k, v = (torch.randn_like(o) for o in out)  # the forward's outputs' gradients
    return ratios


def steps(report: Report, shape: Shape, dtype: str) -> list[Step]:
    def measure() -> None:
        report["memory"] = {shape.name: peak_over_results(shape, getattr(torch, dtype))}

    return [(f"memory: peak of {shape.name}", measure)]

"""Where an eager attention block's host time goes: ``python -m benchmarks.block_stages``.

The attention benchmark's eager-matmul block (expansion, ``q @ k^T``, scale, causal mask,
float32 softmax, cast, ``@ v``, then the backward of q, k and v) taken apart: each step's
host time is read around its call (no synchronisation, so it is what the Python thread
spends), the expansions take turns call by call, and each step's median is kept. Where the
block is host-bound, its wall time is the sum of these. On a CPU the steps run the reference
and the kernels' host costs are not what a GPU's would be. Writes block-stages.json.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

import neuralops_gqa
from benchmarks import cases, cli, peers

EXPANSIONS = ("hf", "neuralops_repeat_kv", "neuralops_gqa_expand")
STEPS = (
    "expansion",
    "transpose",
    "q @ k^T",
    "scale",
    "mask",
    "masked_fill",
    "softmax",
    "cast",
    "@ v",
    "backward",
)


def expansion(name: str, n_rep: int) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    if name == "hf":
        return lambda k, v: peers.hf(k, v, n_rep)
    if name == "neuralops_repeat_kv":
        return lambda k, v: (neuralops_gqa.repeat_kv(k, n_rep), neuralops_gqa.repeat_kv(v, n_rep))
    return lambda k, v: neuralops_gqa.gqa_expand(k, v, k.shape[1], k.shape[1] * n_rep)


def staged_block(
    shape: cases.Shape, dtype: torch.dtype, device: str
) -> Callable[[str, list[list[int]]], None]:
    """``run(expansion, samples)``: one forward + backward, each step's nanoseconds appended to ``samples``."""
    q = shape.tensors(dtype, device, shape.heads, True)[0]
    k, v = shape.tensors(dtype, device, requires_grad=True)
    grad = torch.randn_like(q)
    expand = {name: expansion(name, shape.n_rep) for name in EXPANSIONS}
    scale = shape.dim**-0.5
    clock = time.perf_counter_ns

    def run(name: str, samples: list[list[int]]) -> None:
        t0 = clock()
        ke, ve = expand[name](k, v)
        t1 = clock()
        kt = ke.transpose(2, 3)
        t2 = clock()
        scores = torch.matmul(q, kt)
        t3 = clock()
        scores = scores * scale
        t4 = clock()
        causal = torch.ones(q.shape[2], ke.shape[2], dtype=torch.bool, device=q.device).triu(1)
        t5 = clock()
        scores = scores.masked_fill(causal, float("-inf"))
        t6 = clock()
        weights = F.softmax(scores, dim=-1, dtype=torch.float32)
        t7 = clock()
        weights = weights.to(q.dtype)
        t8 = clock()
        out = torch.matmul(weights, ve)
        t9 = clock()
        torch.autograd.grad(out, (q, k, v), grad)
        t10 = clock()
        marks = (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, t10)
        for step, (start, end) in enumerate(itertools.pairwise(marks)):
            samples[step].append(end - start)

    return run


FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for block-stages.json"),
    cli.DEVICE,
    ("--case", tuple(c.name for c in cases.ATTENTION), "gqa-small", "an attention benchmark case"),
    ("--calls", cli.at_least(1), 1000, "timed calls of each expansion (after 200 untimed)"),
]


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("python -m benchmarks.block_stages", __doc__ or "", FLAGS)
    args = parser.parse_args(argv)
    cli.check_out(parser, args.out)
    cli.check_device(parser, args.device)
    shape = next(c for c in cases.ATTENTION if c.name == args.case)
    if args.device == "cpu":
        shape = shape.scaled(int(cases.ATTENTION_CPU_MAX_MB * 2**20), 4)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    run = staged_block(shape, dtype, args.device)
    samples: dict[str, list[list[int]]] = {name: [[] for _ in STEPS] for name in EXPANSIONS}
    for call in range(200 + args.calls):
        for name in EXPANSIONS:
            run(name, samples[name] if call >= 200 else [[] for _ in STEPS])
        if call % 50 == 0 and args.device == "cuda":
            torch.cuda.synchronize()  # the GPU's queue stays short: the host, not a full queue, sets the pace
    us = {
        name: {step: statistics.median(s) / 1e3 for step, s in zip(STEPS, samples[name])}
        for name in EXPANSIONS
    }
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"{shape.name} ({shape.describe()}), {dtype}, {device}: host us per step, medians of {args.calls} calls"
    )
    print(f"{'step':12s}" + "".join(f"{name:>22s}" for name in EXPANSIONS))
    for step in STEPS:
        print(f"{step:12s}" + "".join(f"{us[name][step]:22.1f}" for name in EXPANSIONS))
    print(f"{'sum':12s}" + "".join(f"{sum(us[name].values()):22.1f}" for name in EXPANSIONS))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "block-stages.json"
    report = {"device": device, "torch": torch.__version__, "case": shape.name, "dtype": str(dtype),
              "calls": args.calls, "us": us}  # fmt: skip
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

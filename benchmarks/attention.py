"""The expansion inside attention blocks, peers as users run them: ``python -m benchmarks.attention``.

Each case is one attention block: k and v expanded from H_kv to H heads, then PyTorch's SDPA
(causal) or the eager matmul attention of transformers' "eager" (matmul, scale, causal mask,
float32 softmax, matmul). The expansions:
  hf                    Hugging Face's repeat_kv with its real output: a copy, or with one KV
                        head a broadcast view, which SDPA reads in place and matmul copies
                        itself unless the batch is 1
  hf_again              the same block again, a function of its own (so compiled, a graph of
                        its own): how far two identical blocks read apart in one run, the
                        spread of every ratio to hf
  neuralops_repeat_kv   neuralops_gqa.repeat_kv on k, then on v (the same choice)
  neuralops_gqa_expand  neuralops_gqa.gqa_expand, k and v in one call (always a copy)
  enable_gqa            SDPA only: its own grouped-query support, no copy at all (the anchor)
Each eager and compiled (torch.compile, default mode), forward alone and forward + backward
(gradients of q, k and v), as wall time per call with calls queued back to back: what a
training loop pays, the host's cost where it bounds the block and the GPU's elsewhere. The
expansions of a block take turns in rounds. On a CPU the cases are scaled down (--max-mb):
the code paths, not figures comparable with a GPU's.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

import neuralops_gqa
from benchmarks import cases, cli, peers, results, timing
from benchmarks.cases import Shape

CONSUMERS = ("sdpa", "eager")
EXPANSIONS = ("hf", "hf_again", "neuralops_repeat_kv", "neuralops_gqa_expand", "enable_gqa")


@functools.cache
def block(consumer: str, expansion: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``(q, k, v) -> output`` of one consumer and expansion, with a code object of its own (so
    compiled variants never share dynamo's cache)."""

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n_rep = q.shape[1] // k.shape[1]
        if expansion == "enable_gqa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if expansion == "neuralops_gqa_expand":
            k, v = neuralops_gqa.gqa_expand(k, v, k.shape[1], q.shape[1])
        elif expansion == "neuralops_repeat_kv":
            k, v = neuralops_gqa.repeat_kv(k, n_rep), neuralops_gqa.repeat_kv(v, n_rep)
        else:  # hf, hf_again
            k, v = peers.hf(k, v, n_rep)
        if consumer == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        weights = F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1, dtype=torch.float32).to(
            q.dtype
        )
        return torch.matmul(weights, v)

    code = attention.__code__.replace(co_name=f"{consumer}_{expansion}")
    return types.FunctionType(code, attention.__globals__, code.co_name, None, attention.__closure__)


def measure(report: results.Report, case: Shape, consumer: str, mode: str, expansions: list[str], device: str,
            effort: timing.Effort, backend: str) -> None:  # fmt: skip
    """Every expansion of one block, forward and forward + backward, interleaved."""
    dtype = getattr(torch, report["dtype"])
    q, (k, v) = (
        case.tensors(dtype, device, case.heads, True)[0],
        case.tensors(dtype, device, requires_grad=True),
    )
    grad = torch.randn_like(q)
    candidates: dict[str, Callable[[], object]] = {}
    for expansion in expansions:
        fn = block(consumer, expansion)
        fn = peers.compiled(fn, "default", backend) if mode == "compiled" else fn
        candidates[f"{expansion} forward"] = functools.partial(fn, q, k, v)
        candidates[f"{expansion} backward"] = functools.partial(_forward_backward, fn, q, k, v, grad)
    us = timing.wall_us(candidates, device, effort)
    for e in expansions:
        row = {"case": asdict(case), "consumer": consumer, "expansion": e, "mode": mode}
        report["rows"].append(
            {**row, "forward_ms": us[f"{e} forward"] / 1e3, "forward_backward_ms": us[f"{e} backward"] / 1e3}
        )
    if device == "cuda":
        torch.cuda.empty_cache()


def _forward_backward(
    fn: Callable[[Tensor, Tensor, Tensor], Tensor], q: Tensor, k: Tensor, v: Tensor, grad: Tensor
) -> None:
    torch.autograd.grad(fn(q, k, v), (q, k, v), grad)


NAMES = [c.name for c in cases.ATTENTION]
FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for attention.json"),
    cli.DEVICE,
    ("--dtype", cli.dtypes(cli.FLOAT_DTYPES), "bfloat16", cli.dtype_help(cli.FLOAT_DTYPES)),
    ("--cases", cli.names(NAMES, "case"), ",".join(NAMES), "listed below"),
    ("--compiled-cases", cli.names(NAMES, "case"), None, "the cases the compiled mode runs (default: --cases)"),
    ("--consumers", cli.names(CONSUMERS, "consumer"), ",".join(CONSUMERS), ", ".join(CONSUMERS)),
    ("--expansions", cli.names(EXPANSIONS, "expansion"), ",".join(EXPANSIONS), "described above (hf always runs)"),
    ("--modes", cli.names(("eager", "compiled"), "mode"), "eager,compiled", "eager, compiled"),
    ("--max-mb", cli.positive_mb, None, f"scale cases down to this (default: none; a CPU: {cases.ATTENTION_CPU_MAX_MB:g})"),
    ("--warmup-ms", cli.at_least(1), 25, "warm-up per block"),
    ("--rep-ms", cli.at_least(1), 100, "measuring time per block"),
    cli.BACKEND,
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    epilog = "cases (B, H_kv->H, N, D):\n" + "\n".join(
        f"  {c.name:<12} {c.describe()}" for c in cases.ATTENTION
    )
    parser = cli.parser("python -m benchmarks.attention", __doc__ or "", FLAGS, epilog)
    parser.add_argument(
        "--combine", type=Path, nargs="+", metavar="JSON", help="one report from these files, and exit"
    )
    args = parser.parse_args(argv)
    cli.check_out(parser, args.out)
    path = args.out / "attention.json"
    if args.combine:
        reports = results.read(parser, args.combine, "--combine", "attention")
        combined = {**reports[0], "command": [r["command"] for r in reports]}
        results.write({**combined, "rows": [row for r in reports for row in r["rows"]]}, path)
        print(f"wrote {path}")
        return 0
    cli.check_device(parser, args.device)
    dtype, cuda = args.dtype[0], args.device == "cuda"
    max_mb = args.max_mb or (None if cuda else cases.ATTENTION_CPU_MAX_MB)
    chosen = [c for c in cases.ATTENTION if c.name in args.cases]
    chosen = [c.scaled(int(max_mb * 2**20), getattr(torch, dtype).itemsize) if max_mb else c for c in chosen]
    expansions = list(dict.fromkeys(["hf", *args.expansions]))
    effort = timing.Effort(args.warmup_ms, args.rep_ms, rounds=10 if cuda else 3)
    report = {**results.new("attention", args.device, "benchmarks.attention", argv), "dtype": dtype}
    report.update(timing="wall", rows=[])
    todo = [(case, consumer, mode) for case in chosen for mode in args.modes for consumer in args.consumers
            if mode == "eager" or case.name in (args.compiled_cases or args.cases)]  # fmt: skip
    steps = [
        (f"{mode} {case.name} {consumer}", functools.partial(
            measure, report, case, consumer, mode, [e for e in expansions if consumer == "sdpa" or e != "enable_gqa"],
            args.device, effort, args.compile_backend))
        for case, consumer, mode in todo
    ]  # fmt: skip
    with results.saved(report, path), peers.recompile_limits_lifted():
        results.run_steps(steps, report, optional="compiled")  # a compiler may be missing
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

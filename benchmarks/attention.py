"""The expansion inside attention blocks, with peers as users run them: ``python -m benchmarks.attention``.

An expansion is only worth what it costs the attention that consumes it. Each case is one
attention block: k and v expanded from ``H_kv`` to ``H`` heads, then either PyTorch's SDPA
(causal) or the eager matmul attention transformers' ``"eager"`` runs (matmul, scale,
float32 softmax, matmul). The expansions:

- ``hf``: Hugging Face's ``repeat_kv`` with its real output: a copy for ``H_kv > 1``, a
  broadcast view (stride 0 over the heads) for one KV head, which SDPA reads in place and
  ``torch.matmul`` copies itself unless the batch is 1;
- ``neuralops_repeat_kv``: ``neuralops_gqa.repeat_kv``, which makes the same choice;
- ``neuralops_op``: ``torch.ops.neuralops.gqa_expand``, always a fresh contiguous copy;
- ``enable_gqa`` (SDPA only): no expansion at all, SDPA's own grouped-query support: the
  no-copy anchor.

Each is timed eager and under ``torch.compile``, forward alone and forward + backward
(gradients of q, k and v), in GQA and MQA configurations: medians of
``triton.testing.do_bench`` (CUDA events, L2 flushed) in one process. The JSON keeps every
time and each case's ratio to ``hf``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

import neuralops_gqa
from benchmarks import cli
from benchmarks.bench import Shape, machine_info
from neuralops_gqa.selfcheck import hf_repeat_kv

CASES = (
    Shape("gqa", 8, 8, 32, 1024, 128),
    Shape("mqa", 8, 1, 32, 1024, 128),
    Shape("mqa-batch-1", 1, 1, 32, 4096, 128),
)
CONSUMERS = ("sdpa", "eager")
EXPANSIONS = ("hf", "neuralops_repeat_kv", "neuralops_op", "enable_gqa")


def _expand(expansion: str, x: Tensor, n_rep: int) -> Tensor:
    if expansion == "hf":
        return hf_repeat_kv(x, n_rep)
    if expansion == "neuralops_repeat_kv":
        return neuralops_gqa.repeat_kv(x, n_rep)
    raise ValueError(expansion)


def block(consumer: str, expansion: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """The attention block ``(q, k, v) -> output`` of one consumer and one expansion."""

    def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n_rep = q.shape[1] // k.shape[1]
        if expansion == "enable_gqa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        if expansion == "neuralops_op":
            k, v = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], q.shape[1])
        else:
            k, v = _expand(expansion, k, n_rep), _expand(expansion, v, n_rep)
        if consumer == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(weights, v)

    attention.__name__ = f"{consumer}_{expansion}"  # compiled variants keep their own caches
    return attention


def inputs(case: Shape, dtype: torch.dtype, device: str) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)

    def one(heads: int) -> Tensor:
        x = torch.randn(case.batch, heads, case.seq, case.dim, device=device, dtype=dtype, generator=gen)
        return x.requires_grad_()

    return one(case.heads), one(case.kv_heads), one(case.kv_heads)


def median_ms(fn: Callable[[], object], device: str, warmup_ms: int, rep_ms: int) -> float:
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def measure(
    case: Shape,
    consumer: str,
    expansion: str,
    mode: str,
    dtype: torch.dtype,
    device: str,
    effort: tuple[int, int],
) -> dict[str, float]:
    fn = block(consumer, expansion)
    if mode == "compiled":
        torch._dynamo.reset()  # every block is the same code object: a fresh cache each
        fn = torch.compile(fn, fullgraph=True, dynamic=False)
    q, k, v = inputs(case, dtype, device)
    out = fn(q, k, v)
    grad = torch.randn_like(out)

    def forward() -> None:
        fn(q, k, v)

    def forward_backward() -> None:
        torch.autograd.grad(fn(q, k, v), (q, k, v), grad)

    forward_backward()  # compiles the backward too
    return {
        "forward_ms": median_ms(forward, device, *effort),
        "forward_backward_ms": median_ms(forward_backward, device, *effort),
    }


def cases_to_run(consumers: list[str], expansions: list[str]) -> list[tuple[str, str]]:
    return [(c, e) for c in consumers for e in expansions if not (e == "enable_gqa" and c != "sdpa")]


def run(args: argparse.Namespace) -> dict[str, Any]:
    dtype = getattr(torch, args.dtype)
    rows = []
    selected = [c for c in CASES if c.name in args.cases]
    todo = [
        (case, c, e, m)
        for case in selected
        for c, e in cases_to_run(args.consumers, args.expansions)
        for m in args.modes
    ]
    start = time.perf_counter()
    for i, (case, consumer, expansion, mode) in enumerate(todo):
        times = measure(case, consumer, expansion, mode, dtype, args.device, (args.warmup_ms, args.rep_ms))
        rows.append(
            {"case": asdict(case), "consumer": consumer, "expansion": expansion, "mode": mode, **times}
        )
        print(f"  [{i + 1}/{len(todo)} {time.perf_counter() - start:4.0f}s] {case.name:12s} {consumer:6s} {mode:9s} "
              f"{expansion:20s} fwd {times['forward_ms']:8.3f} ms  fwd+bwd {times['forward_backward_ms']:8.3f} ms",
              file=sys.stderr, flush=True)  # fmt: skip
        if args.device == "cuda":
            torch.cuda.empty_cache()
    for row in rows:  # each against Hugging Face's repeat_kv in the same block, mode and case
        hf = next(r for r in rows if (r["case"], r["consumer"], r["mode"], r["expansion"]) ==
                  (row["case"], row["consumer"], row["mode"], "hf"))  # fmt: skip
        row["speedup_over_hf"] = {p: hf[f"{p}_ms"] / row[f"{p}_ms"] for p in ("forward", "forward_backward")}
    return {
        "machine": machine_info(args.device),
        "device": args.device,
        "dtype": args.dtype,
        "command": ["python", "-m", "benchmarks.attention", *sys.argv[1:]],
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    """One table per case: time per block and the ratio to ``hf`` (above 1: faster than it)."""
    lines = []
    for case in dict.fromkeys(json.dumps(r["case"], sort_keys=True) for r in report["rows"]):
        rows = [r for r in report["rows"] if json.dumps(r["case"], sort_keys=True) == case]
        c = rows[0]["case"]
        lines += [
            "",
            f"**{c['name']}**: B={c['batch']}, {c['kv_heads']} -> {c['heads']} heads, N={c['seq']}, D={c['dim']}, "
            f"{report['dtype']}",
            "",
            "| block | mode | expansion | forward ms | vs hf | forward + backward ms | vs hf |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            s = r["speedup_over_hf"]
            lines.append(
                f"| {r['consumer']} | {r['mode']} | {r['expansion']} | {r['forward_ms']:.3f} | "
                f"{math.floor(s['forward'] * 100) / 100:.2f}x | {r['forward_backward_ms']:.3f} | "
                f"{math.floor(s['forward_backward'] * 100) / 100:.2f}x |"
            )
    return "\n".join(lines).lstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.attention", description=__doc__.split("\n\n")[1]
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to run (default: the GPU if there is one)")  # fmt: skip
    parser.add_argument(
        "--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16", help="dtype of q, k, v"
    )
    parser.add_argument("--cases", type=cli.names((c.name for c in CASES), "case"), default=[c.name for c in CASES],
                        help=", ".join(f"{c.name} (B={c.batch}, {c.kv_heads}->{c.heads}, N={c.seq}, D={c.dim})" for c in CASES))  # fmt: skip
    parser.add_argument(
        "--consumers", type=cli.names(CONSUMERS, "consumer"), default=list(CONSUMERS), help="sdpa, eager"
    )
    parser.add_argument(
        "--expansions",
        type=cli.names(EXPANSIONS, "expansion"),
        default=list(EXPANSIONS),
        help=", ".join(EXPANSIONS),
    )
    parser.add_argument(
        "--modes",
        type=cli.names(("eager", "compiled"), "mode"),
        default=["eager", "compiled"],
        help="eager, compiled",
    )
    parser.add_argument("--warmup-ms", type=cli.at_least(1), default=25, help="do_bench warm-up")
    parser.add_argument("--rep-ms", type=cli.at_least(1), default=100, help="do_bench repetitions")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-out"), help="folder for attention.json and .md"
    )
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                        help="write one report from these attention.json files (same machine) and exit")  # fmt: skip
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available() and not args.combine:
        parser.error("--device cuda: no CUDA device is available here (use --device cpu)")
    cli.output_folder(parser, args.out)
    if args.combine:
        reports = cli.read_reports(parser, args.combine, "--combine")
        report = {
            **reports[0],
            "command": [r["command"] for r in reports],
            "rows": [x for r in reports for x in r["rows"]],
        }
    else:
        report = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention.json").write_text(json.dumps(report, indent=1) + "\n")
    text = markdown(report)
    (args.out / "attention.md").write_text(text)
    print(text)
    print(f"wrote attention.json, attention.md in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""End-to-end benchmark: one training step of a small Llama on stock and neuralops attention.

``python -m benchmarks.e2e_transformers --out e2e.json``

A randomly initialised Llama (on CUDA by default 4 layers, hidden 2048, 16 query and 4 KV
heads of dim 128, bfloat16; on CPU a tiny float32 one) takes a forward and backward step
on a left-padded batch, so the attention gets a mask and stock ``"sdpa"`` must call
``repeat_kv``. One model switches between ``"sdpa"``, ``"neuralops_sdpa"``, ``"eager"``
and ``"neuralops_eager"`` with ``set_attn_implementation``, so all four run the same
weights on the same batch. After warmup the implementations take turns, one step each per
round, so clock and thermal drift hit them alike; each step is timed with CUDA events
(wall clock on CPU). Reported per implementation: the median and every step's ms, the
peak memory of a step, and the loss (stock and ours must agree); and the speedup of each
neuralops implementation over its stock counterpart. Writes JSON to ``--out``.

This measures what the op changes in a whole model; the op alone is measured by
``python -m benchmarks.bench``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
import transformers

from benchmarks import cli
from benchmarks.bench import machine_info
from neuralops_gqa.integrations import transformers as neuralops_transformers

PAIRS = (("sdpa", "neuralops_sdpa"), ("eager", "neuralops_eager"))


@dataclass(frozen=True)
class Setup:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    seq: int
    dtype: str


# About 310M parameters with the embeddings; 16k tokens a step, a few seconds per
# implementation on an H200 including warmup. Eager attention keeps [B, H, N, N] float32
# softmax inputs: about 12 GiB at this size.
CUDA_SETUP = Setup(
    layers=4,
    hidden=2048,
    heads=16,
    kv_heads=4,
    intermediate=5632,
    vocab=32000,
    batch=8,
    seq=2048,
    dtype="bfloat16",
)
CPU_SETUP = Setup(
    layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=128, batch=2, seq=16, dtype="float32"
)


def build_model(setup: Setup, device: str) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=setup.vocab,
        hidden_size=setup.hidden,
        intermediate_size=setup.intermediate,
        num_hidden_layers=setup.layers,
        num_attention_heads=setup.heads,
        num_key_value_heads=setup.kv_heads,
        max_position_embeddings=setup.seq,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(
        config, dtype=getattr(torch, setup.dtype)
    )
    return cast(transformers.PreTrainedModel, model.to(device).train())


def padded_batch(setup: Setup, device: str) -> dict[str, torch.Tensor]:
    """Left padding from none to a quarter of the sequence, a different amount per row."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, setup.vocab, (setup.batch, setup.seq), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(setup.batch):
        mask[row, : row * setup.seq // (4 * setup.batch)] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def _step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss: torch.Tensor = model(**batch).loss
    loss.backward()
    return loss.detach()


def time_step(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], device: str
) -> tuple[float, float, int | None]:
    """(ms, loss, peak bytes) of one forward + backward step; no peak on CPU."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = _step(model, batch)
        end.record()
        end.synchronize()
        return start.elapsed_time(end), float(loss), torch.cuda.max_memory_allocated()
    began = time.perf_counter()
    loss = _step(model, batch)
    return (time.perf_counter() - began) * 1e3, float(loss), None


def run(
    setup: Setup, device: str, implementations: list[str], warmup: int, repeats: int
) -> list[dict[str, Any]]:
    neuralops_transformers.register()
    model = build_model(setup, device)
    batch = padded_batch(setup, device)
    for name in implementations:
        model.set_attn_implementation(name)
        for _ in range(warmup):
            _step(model, batch)
    steps: dict[str, list[tuple[float, float, int | None]]] = {name: [] for name in implementations}
    for _ in range(repeats):
        for name in implementations:
            model.set_attn_implementation(name)
            steps[name].append(time_step(model, batch, device))
    results: list[dict[str, Any]] = []
    for name in implementations:
        ms = [s[0] for s in steps[name]]
        results.append(
            {
                "implementation": name,
                "median_ms": statistics.median(ms),
                "min_ms": min(ms),
                "step_ms": ms,
                "peak_memory_bytes": None if device != "cuda" else max(s[2] or 0 for s in steps[name]),
                "loss": steps[name][-1][1],
            }
        )
    return results


def speedups(results: list[dict[str, Any]]) -> dict[str, float]:
    """Stock median / neuralops median, per pair whose both sides ran."""
    median = {r["implementation"]: r["median_ms"] for r in results}
    return {
        f"{ours} vs {stock}": median[stock] / median[ours]
        for stock, ours in PAIRS
        if stock in median and ours in median
    }


def environment(device: str) -> dict[str, str]:
    """The benchmark's machine information, as this report names it, with transformers' version."""
    info = machine_info(device)
    return {
        "device": info.get("gpu", info["cpu"]),
        "torch": info["torch"],
        "cuda": str(torch.version.cuda),
        "triton": info["triton"],
        "transformers": transformers.__version__,
        "neuralops_gqa": info["neuralops_gqa"],
        "python": info["python"],
    }


IMPLEMENTATIONS = tuple(name for pair in PAIRS for name in pair)


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, Setup]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.e2e_transformers", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to run (default: the GPU if there is one); CUDA picks the large model, a CPU the tiny one",
    )
    parser.add_argument("--out", type=Path, default=Path("bench_transformers.json"), help="JSON report path")
    parser.add_argument("--warmup", type=cli.at_least(0), default=3, help="untimed steps per implementation")
    parser.add_argument("--repeats", type=cli.at_least(1), default=10, help="timed steps per implementation")
    parser.add_argument(
        "--implementations",
        type=cli.names(IMPLEMENTATIONS, "implementation"),
        default=",".join(IMPLEMENTATIONS),
        help=f"comma-separated attn_implementation names (from {', '.join(IMPLEMENTATIONS)})",
    )
    for field in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab", "batch", "seq"):
        parser.add_argument(
            f"--{field.replace('_', '-')}",
            type=cli.at_least(1),
            help=f"override the device's default {field}",
        )
    parser.add_argument(
        "--dtype",
        type=cli.dtype_names(("bfloat16", "float16", "float32")),
        help="override the device's default: bfloat16, float16 or float32 (or bf16, fp16, fp32)",
    )
    args = parser.parse_args(argv)
    if args.dtype is not None:
        if len(args.dtype) != 1:
            parser.error(f"--dtype: give one dtype, got {', '.join(args.dtype)}")
        args.dtype = args.dtype[0]
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; give the JSON file's path")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here (use --device cpu)")
    base = asdict(CUDA_SETUP if args.device == "cuda" else CPU_SETUP)
    setup = Setup(**{k: v if getattr(args, k) is None else getattr(args, k) for k, v in base.items()})
    if setup.heads % setup.kv_heads:
        parser.error(f"--heads ({setup.heads}) must be a multiple of --kv-heads ({setup.kv_heads})")
    if setup.hidden % setup.heads:
        parser.error(f"--hidden ({setup.hidden}) must be a multiple of --heads ({setup.heads})")
    return args, setup


def main(argv: list[str] | None = None) -> int:
    args, setup = _parse(argv)
    implementations = args.implementations
    env = environment(args.device)
    print(", ".join(f"{k} {v}" for k, v in env.items()))
    print(f"Llama {setup}, left-padded batch, forward + backward")
    results = run(setup, args.device, implementations, args.warmup, args.repeats)
    for r in results:
        peak = "" if r["peak_memory_bytes"] is None else f"peak {r['peak_memory_bytes'] / 2**30:6.2f} GiB  "
        print(
            f"  {r['implementation']:16s} {r['median_ms']:9.2f} ms/step (median of {len(r['step_ms'])})  "
            f"{peak}loss {r['loss']:.6f}"
        )
    ratios = speedups(results)
    for pair, ratio in ratios.items():
        print(f"  {pair}: {ratio:.3f}x")
    report = {
        "environment": env,
        "setup": asdict(setup),
        "padding": "left, row i padded by i * seq // (4 * batch) tokens",
        "step": "forward + backward (loss over non-pad tokens), gradients set to None before each step",
        "warmup": args.warmup,
        "repeats": args.repeats,
        "results": results,
        "speedup": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

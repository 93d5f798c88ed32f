"""One training step of a Llama on stock and neuralops attention: ``python -m benchmarks.e2e_transformers``.

A randomly initialised Llama (--model, listed below) takes a forward and backward step on a
left-padded batch, so the attention gets a mask and stock "sdpa" must call repeat_kv. One
model switches between "sdpa", "neuralops_sdpa", "eager" and "neuralops_eager" with
set_attn_implementation, so all run the same weights on the same batch. After warm-up the
implementations take turns, one step each per round (drift hits them alike); each step is
timed with CUDA events around it (the host's time shows where it bounds the step; wall
clock on a CPU). Reported per implementation: the median and every step's ms, the peak
memory of a step and the loss (stock's and ours agree), and each neuralops implementation's
speedup over its stock counterpart. The small model is host-bound, the large one GPU-bound.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, cast

import torch
import transformers

from benchmarks import cases, cli, results
from neuralops_gqa.integrations import transformers as neuralops_transformers

PAIRS = (("sdpa", neuralops_transformers.SDPA), ("eager", neuralops_transformers.EAGER))
IMPLEMENTATIONS = tuple(name for pair in PAIRS for name in pair)
PADDING = "left, row i padded by i * seq // (4 * batch) tokens"
STEP = "forward + backward (loss over non-pad tokens), gradients set to None before each step"


def build_model(model: cases.Model, device: str) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=model.vocab,
        hidden_size=model.hidden,
        intermediate_size=model.intermediate,
        num_hidden_layers=model.layers,
        num_attention_heads=model.heads,
        num_key_value_heads=model.kv_heads,
        max_position_embeddings=model.seq,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    built = transformers.AutoModelForCausalLM.from_config(config, dtype=getattr(torch, model.dtype))
    return cast(transformers.PreTrainedModel, built.to(device).train())


def padded_batch(model: cases.Model, device: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, model.vocab, (model.batch, model.seq), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(model.batch):
        mask[row, : row * model.seq // (4 * model.batch)] = 0
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
    """(ms, loss, peak bytes) of one forward + backward step; no peak on a CPU."""
    if device != "cuda":
        began = time.perf_counter()
        loss = _step(model, batch)
        return (time.perf_counter() - began) * 1e3, float(loss), None
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss = _step(model, batch)
    end.record()
    end.synchronize()
    return start.elapsed_time(end), float(loss), torch.cuda.max_memory_allocated()


def run(
    report: dict[str, Any],
    model: cases.Model,
    device: str,
    implementations: list[str],
    warmup: int,
    repeats: int,
) -> None:
    """Fill ``report["results"]`` round by round (a stopped run keeps the rounds it finished)."""
    neuralops_transformers.register()
    net, batch = build_model(model, device), padded_batch(model, device)
    for i, name in enumerate(implementations, 1):
        print(f"[warm-up {i}/{len(implementations)}] {name}", file=sys.stderr, flush=True)
        net.set_attn_implementation(name)
        for _ in range(warmup):
            _step(net, batch)
    rows: dict[str, dict[str, Any]] = {
        n: {"implementation": n, "step_ms": [], "peak_memory_bytes": None} for n in implementations
    }
    report["results"] = list(rows.values())
    for round_ in range(repeats):
        for name in implementations:
            net.set_attn_implementation(name)
            ms, loss, peak = time_step(net, batch, device)
            row = rows[name]
            row["step_ms"].append(ms)
            row.update(median_ms=statistics.median(row["step_ms"]), min_ms=min(row["step_ms"]), loss=loss)
            if peak is not None:
                row["peak_memory_bytes"] = max(row["peak_memory_bytes"] or 0, peak)
        report["speedup"] = {
            f"{ours} vs {stock}": rows[stock]["median_ms"] / rows[ours]["median_ms"]
            for stock, ours in PAIRS
            if stock in rows and ours in rows
        }
        print(
            f"[round {round_ + 1}/{repeats}] "
            + ", ".join(f"{n} {r['median_ms']:.2f} ms" for n, r in rows.items()),
            file=sys.stderr,
            flush=True,
        )


SIZES = [f.name for f in fields(cases.Model) if f.name != "dtype"]
FLAGS: list[cli.Flag] = [
    cli.DEVICE,
    ("--model", tuple(cases.MODELS), None, "listed below (default: large on CUDA, tiny on a CPU)"),
    ("--out", Path, Path("bench_transformers.json"), "the result file's path"),
    ("--warmup", cli.at_least(0), 3, "untimed steps per implementation"),
    ("--repeats", cli.at_least(1), 10, "timed steps per implementation"),
    ("--implementations", cli.names(IMPLEMENTATIONS, "implementation"), ",".join(IMPLEMENTATIONS), "attn_implementation names"),
    *((f"--{name.replace('_', '-')}", cli.at_least(1), None, f"override the model's {name}") for name in SIZES),
    ("--dtype", cli.dtypes(cli.FLOAT_DTYPES), None, "override the model's dtype: " + cli.dtype_help(cli.FLOAT_DTYPES)),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    epilog = "models:\n" + "\n".join(f"  {n:<6} {m}" for n, m in cases.MODELS.items())
    parser = cli.parser("python -m benchmarks.e2e_transformers", __doc__ or "", FLAGS, epilog)
    args = parser.parse_args(argv)
    if args.dtype is not None and len(args.dtype) != 1:
        parser.error(f"--dtype: give one dtype, got {', '.join(args.dtype)}")
    cli.check_out(parser, args.out, folder=False)
    cli.check_device(parser, args.device)
    model = cases.MODELS[args.model or ("large" if args.device == "cuda" else "tiny")]
    overrides = {f.name: getattr(args, f.name) for f in fields(model) if getattr(args, f.name) is not None}
    model = replace(model, **{**overrides, **({"dtype": args.dtype[0]} if args.dtype else {})})
    if model.heads % model.kv_heads:
        parser.error(f"--heads ({model.heads}) must be a multiple of --kv-heads ({model.kv_heads})")
    if model.hidden % model.heads:
        parser.error(f"--hidden ({model.hidden}) must be a multiple of --heads ({model.heads})")
    report = results.new("e2e", args.device, "benchmarks.e2e_transformers", argv)
    report["machine"]["transformers"] = transformers.__version__
    report.update(model=args.model, setup=asdict(model), padding=PADDING, step=STEP, results=[], speedup={})
    report.update(warmup=args.warmup, repeats=args.repeats)
    print(f"Llama {model}, left-padded batch, forward + backward", file=sys.stderr)
    with results.saved(report, args.out):
        run(report, model, args.device, args.implementations, args.warmup, args.repeats)
    for pair, ratio in report["speedup"].items():
        print(f"  {pair}: {ratio:.3f}x")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

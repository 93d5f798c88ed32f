"""``python -m neuralops_gqa``: check the op on this machine's device, then time it against Hugging Face.

Four steps, each printed as it finishes: the op against ``repeat_interleave`` (forward,
bit-exact, on a small mixed-layout sample and on the timed shape) and a float64 group sum
(backward); the op inside ``torch.compile`` and inside a ``torch.export`` graph; a short
timing against Hugging Face's eager ``repeat_kv``; a one-line verdict. ``--help`` lists the
options (device, dtype, shape). For the full benchmark see ``python -m benchmarks.bench``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

import neuralops_gqa
from neuralops_gqa.backend import backend


def hf_repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """Hugging Face's ``repeat_kv`` as its Llama-style models write it: a broadcast view, then a
    reshape that copies (a view when there is one KV head). What the check and the benchmark
    compare with; ``tests/test_model_swap.py`` checks it against the installed transformers."""
    batch, kv_heads, seq, dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, dim)


# The names --dtype accepts: PyTorch's own and the usual short forms.
DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "f16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "f32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "f64": torch.float64,
    "double": torch.float64,
}
# (B, H_kv, H, N, D) timed when --shape is not given: a Llama-3-8B layer's KV on a GPU, a
# quarter of its sequence on a CPU (where the copy runs at memory speed on a few cores).
DEFAULT_SHAPES = {"cuda": (4, 8, 32, 4096, 128), "cpu": (1, 8, 32, 1024, 128)}
Shape = tuple[int, int, int, int, int]


def _attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    k, v = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Block(torch.nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return _attention(q, k, v)


def check_correctness(device: str, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Failures, as sentences; empty when everything matched."""
    failures = []
    gen = torch.Generator().manual_seed(0)
    # Mixed layouts and head dims: k is a transposed [B, N, H, D] projection.
    k = torch.randn(2, 33, 4, 80, generator=gen).to(device, dtype).transpose(1, 2)
    v = torch.randn(2, 4, 33, 64, generator=gen).to(device, dtype)
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, 4, 32)
    if not (torch.equal(k_out, k.repeat_interleave(8, 1)) and torch.equal(v_out, v.repeat_interleave(8, 1))):
        failures.append("forward differs from repeat_interleave")
    g = torch.randn(2, 32, 33, 80, generator=gen).to(device)
    gk, _ = torch.ops.neuralops.gqa_reduce(g, g, 4, 32)
    if not torch.allclose(gk.double(), g.double().unflatten(1, (4, 8)).sum(2), rtol=1e-6, atol=1e-5):
        failures.append("backward differs from the float64 group sum")
    return failures


def check_compile_export(device: str) -> list[str]:
    failures = []
    q, k, v = (torch.randn(3, h, 20, 16, device=device) for h in (8, 2, 2))
    eager = _attention(q, k, v)
    compiled = torch.compile(_attention, fullgraph=True, dynamic=True)(q, k, v)
    if not torch.allclose(compiled, eager, atol=1e-5):
        failures.append("torch.compile result differs from eager")
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2)
    dims = {0: batch, 2: seq}
    program = torch.export.export(_Block(), (q, k, v), dynamic_shapes=(dims, dims, dims))
    q2, k2, v2 = (torch.randn(5, h, 9, 16, device=device) for h in (8, 2, 2))
    if not torch.allclose(program.module()(q2, k2, v2), _attention(q2, k2, v2), atol=1e-5):
        failures.append("torch.export program differs from eager at new sizes")
    return failures


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _time_us(fn: Callable[[], object], device: str, calls: int = 50) -> float:
    for _ in range(5):
        fn()
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _synchronize(device)
    return (time.perf_counter() - start) / calls * 1e6


def short_benchmark(device: str, dtype: torch.dtype, shape: Shape) -> tuple[float, float, list[str]]:
    """Microseconds per call of both tensors' expansion, ours and Hugging Face's eager one,
    and the failures of the exactness check on these tensors."""
    batch, kv_heads, heads, seq, dim = shape
    k = torch.randn(batch, kv_heads, seq, dim, device=device).to(dtype)
    v = torch.randn(batch, kv_heads, seq, dim, device=device).to(dtype)
    n_rep = heads // kv_heads
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, kv_heads, heads)
    exact = torch.equal(k_out, hf_repeat_kv(k, n_rep)) and torch.equal(v_out, hf_repeat_kv(v, n_rep))
    failures = [] if exact else [f"forward differs from Hugging Face's repeat_kv at {_shape_text(shape)}"]
    ours = _time_us(lambda: torch.ops.neuralops.gqa_expand(k, v, kv_heads, heads), device)
    theirs = _time_us(lambda: (hf_repeat_kv(k, n_rep), hf_repeat_kv(v, n_rep)), device)
    print(f"  {_shape_text(shape)}, {str(dtype).removeprefix('torch.')}, both tensors:")
    print(f"  neuralops {ours:9.1f} us   HF eager repeat_kv {theirs:9.1f} us   ({theirs / ours:.2f}x)")
    return ours, theirs, failures


def _shape_text(shape: Shape) -> str:
    batch, kv_heads, heads, seq, dim = shape
    return f"B={batch}, {kv_heads} -> {heads} heads, N={seq}, D={dim}"


def _speed_sentence(device: str, ratio: float) -> str:
    """What the timing says, given what the op ran on ``device``."""
    if torch.device(device).type == "cuda":
        verdict = "faster than" if ratio >= 1 else "slower than"
        return f"the Triton kernels, {ratio:.2f}x Hugging Face's eager repeat_kv ({verdict} it here)"
    if backend() == "triton":
        return (
            f"{ratio:.2f}x Hugging Face's eager repeat_kv, meaningless: the op ran the Triton kernels "
            "through Triton's interpreter (TRITON_INTERPRET=1), a correctness tool orders of magnitude "
            "slower than compiled code"
        )
    return (
        f"{ratio:.2f}x Hugging Face's eager repeat_kv; on {device} the op runs its PyTorch reference, not the "
        "Triton kernels, so this compares two CPU copies and the op's dispatch (expect about 0.5-1x); "
        "docs/benchmarks.md has the kernels on a GPU"
    )


def _device(text: str) -> str:
    try:
        device = torch.device(text)
        probe = torch.ones(1, device=device)
    except (RuntimeError, AssertionError) as error:  # torch raises AssertionError for a CPU-only build
        raise argparse.ArgumentTypeError(f"{text!r} is not a device this PyTorch can use: {error}") from None
    try:  # the check compares values: a device whose tensors hold none (meta) can't run it
        torch.equal(probe, probe)
    except (NotImplementedError, RuntimeError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: tensors there hold no values to compare (use cpu or cuda)"
        ) from None
    return str(device)


def _dtype(text: str) -> torch.dtype:
    try:
        return DTYPES[text.lower().removeprefix("torch.")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(DTYPES)}") from None


def _shape(text: str) -> Shape:
    parts = text.replace("x", ",").split(",")
    try:
        sizes = [int(part) for part in parts]
    except ValueError:
        sizes = []
    if len(sizes) != 5 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not five positive integers B,H_kv,H,N,D (e.g. 1,8,32,1024,128)"
        )
    batch, kv_heads, heads, seq, dim = sizes
    if heads % kv_heads:
        raise argparse.ArgumentTypeError(f"{text!r}: H ({heads}) must be a multiple of H_kv ({kv_heads})")
    return batch, kv_heads, heads, seq, dim


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m neuralops_gqa",
        description=(
            "Check torch.ops.neuralops.gqa_expand / gqa_reduce on this machine (exact against "
            "repeat_interleave, inside torch.compile and torch.export), then time the expansion of "
            "k and v against Hugging Face's eager repeat_kv. On a CPU the op runs its PyTorch "
            "reference, so the timing is no kernel benchmark. For that: python -m benchmarks.bench."
        ),
    )
    parser.add_argument(
        "--device",
        type=_device,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to run (default: %(default)s, the GPU if there is one)",
    )
    parser.add_argument(
        "--dtype",
        type=_dtype,
        default=torch.bfloat16,
        metavar="{bf16,fp16,fp32,fp64}",
        help="dtype of the timed tensors and of the exactness check (default: bf16; PyTorch's names work too)",
    )
    parser.add_argument(
        "--shape",
        type=_shape,
        default=None,
        metavar="B,H_kv,H,N,D",
        help=(
            "the timed k and v: batch, KV heads, query heads, sequence, head dim (default: "
            f"{','.join(map(str, DEFAULT_SHAPES['cuda']))} on a GPU, "
            f"{','.join(map(str, DEFAULT_SHAPES['cpu']))} elsewhere)"
        ),
    )
    args = parser.parse_args(argv)
    try:
        backend()
    except ValueError as error:
        parser.error(str(error))
    if args.shape is None:
        args.shape = DEFAULT_SHAPES["cuda" if torch.device(args.device).type == "cuda" else "cpu"]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device, dtype, shape = args.device, args.dtype, args.shape
    print(f"neuralops_gqa {neuralops_gqa.__version__}, torch {torch.__version__}, device {device}")
    failures = []
    steps: tuple[tuple[str, Callable[[], list[str]]], ...] = (
        ("correctness", lambda: check_correctness(device, dtype)),
        ("compile and export", lambda: check_compile_export(device)),
    )
    for title, step in steps:
        start = time.perf_counter()
        found = step()
        failures += found
        print(f"[{'ok' if not found else 'FAIL'}] {title} ({time.perf_counter() - start:.1f} s)")
        for failure in found:
            print(f"  {failure}")
    start = time.perf_counter()
    try:
        ours, theirs, found = short_benchmark(device, dtype, shape)
    except (torch.OutOfMemoryError, MemoryError) as error:
        print(f"python -m neuralops_gqa: error: --shape {','.join(map(str, shape))} does not fit on {device}: "
              f"{str(error).splitlines()[0]}", file=sys.stderr)  # fmt: skip
        return 2
    failures += found
    print(f"[{'ok' if not found else 'FAIL'}] short benchmark ({time.perf_counter() - start:.1f} s)")
    for failure in found:
        print(f"  {failure}")
    if failures:
        print(f"verdict: FAIL, {len(failures)} check(s) failed")
        return 1
    print(f"verdict: OK, every check passed. Speed: {_speed_sentence(device, theirs / ours)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

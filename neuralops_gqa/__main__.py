"""``python -m neuralops_gqa``: check the op on this machine's device, then time it against its peers.

Four steps, each printed as it finishes: the op against ``repeat_interleave`` (forward,
bit-exact) and a float64 group sum (backward); the op inside ``torch.compile`` and inside a
``torch.export`` graph; a short timing against Hugging Face's eager ``repeat_kv``; a one-line
verdict. For the full benchmark see ``python -m neuralops_gqa.bench``.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F
from torch import Tensor

import neuralops_gqa
from neuralops_gqa.bench import hf_repeat_kv


def _attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    k, v = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Block(torch.nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return _attention(q, k, v)


def check_correctness(device: str) -> list[str]:
    """Failures, as sentences; empty when everything matched."""
    failures = []
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2, 33, 4, 80, generator=gen).to(device, torch.bfloat16).transpose(1, 2)
    v = torch.randn(2, 4, 33, 64, generator=gen).to(device, torch.bfloat16)
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


def _time_us(fn: object, device: str, calls: int = 50) -> float:
    for _ in range(5):
        fn()  # type: ignore[operator]
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()  # type: ignore[operator]
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def short_benchmark(device: str) -> tuple[float, float]:
    """Microseconds per call of both tensors' expansion, ours and Hugging Face's eager one."""
    shape = (4, 8, 4096, 128) if device == "cuda" else (1, 8, 1024, 128)
    k = torch.randn(shape, device=device, dtype=torch.bfloat16)
    v = torch.randn(shape, device=device, dtype=torch.bfloat16)
    ours = _time_us(lambda: torch.ops.neuralops.gqa_expand(k, v, 8, 32), device)
    theirs = _time_us(lambda: (hf_repeat_kv(k, 4), hf_repeat_kv(v, 4)), device)
    print(f"  B={shape[0]}, 8 -> 32 heads, N={shape[2]}, D=128, bfloat16, both tensors:")
    print(f"  neuralops {ours:9.1f} us   HF eager repeat_kv {theirs:9.1f} us   ({theirs / ours:.2f}x)")
    return ours, theirs


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"neuralops_gqa {neuralops_gqa.__version__}, torch {torch.__version__}, device {device}")
    failures = []
    for title, step in (("correctness", check_correctness), ("compile and export", check_compile_export)):
        start = time.perf_counter()
        found = step(device)
        failures += found
        print(f"[{'ok' if not found else 'FAIL'}] {title} ({time.perf_counter() - start:.1f} s)")
        for failure in found:
            print(f"  {failure}")
    print("[..] short benchmark")
    ours, theirs = short_benchmark(device)
    if failures:
        print(f"verdict: FAIL, {len(failures)} check(s) failed")
        return 1
    print(f"verdict: OK, every check passed; {theirs / ours:.2f}x Hugging Face's eager repeat_kv on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The op inside ``torch.compile`` and ``torch.export`` graphs: same results as eager."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.library import opcheck

from helpers import make_tensor

pytestmark = pytest.mark.slow


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A small GQA attention: expand KV heads with the op, then causal SDPA."""
    k, v = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _qkv(batch: int, seq: int, device: str, seed: int) -> list[torch.Tensor]:
    q = make_tensor((batch, 8, seq, 16), torch.float32, "bnhd", device, seed)
    k = make_tensor((batch, 2, seq, 16), torch.float32, "bnhd", device, seed + 1)
    v = make_tensor((batch, 2, seq, 16), torch.float32, "contiguous", device, seed + 2)
    return [x.detach().requires_grad_() for x in (q, k, v)]


def test_opcheck(backend: str, device: str) -> None:
    """Schema, autograd registration, fake tensors and AOT dispatch with dynamic shapes."""
    samples = [
        (make_tensor((2, 2, 5, 8), torch.float32, "contiguous", device, 1).requires_grad_(),
         make_tensor((2, 2, 5, 6), torch.float32, "bnhd", device, 2).detach().requires_grad_(), 2, 8),
        (make_tensor((1, 3, 4, 80), torch.bfloat16, "offset", device, 3),
         make_tensor((1, 3, 4, 8), torch.float16, "step", device, 4), 3, 3),
        (make_tensor((0, 1, 4, 8), torch.float64, "contiguous", device, 5).requires_grad_(),
         make_tensor((0, 1, 4, 8), torch.float64, "contiguous", device, 6).requires_grad_(), 1, 7),
    ]  # fmt: skip
    for k, v, kv, heads in samples:
        opcheck(torch.ops.neuralops.gqa_expand.default, (k, v, kv, heads))
    grads = [
        (make_tensor((2, 8, 5, 8), torch.float32, "bnhd", device, 7).requires_grad_(),
         make_tensor((2, 8, 5, 3), torch.float32, "permuted", device, 8).detach().requires_grad_(), 2, 8),
        (make_tensor((1, 6, 0, 8), torch.bfloat16, "contiguous", device, 9),
         make_tensor((1, 6, 0, 8), torch.bfloat16, "contiguous", device, 10), 3, 6),
    ]  # fmt: skip
    for gk, gv, kv, heads in grads:
        opcheck(torch.ops.neuralops.gqa_reduce.default, (gk, gv, kv, heads))


def test_compile_dynamic_fullgraph(backend: str, device: str) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(attention, fullgraph=True, dynamic=True)
    for i, (batch, seq) in enumerate([(3, 20), (5, 33)]):  # sizes unlike the head counts: no duck sizing
        q, k, v = _qkv(batch, seq, device, seed=10 * i)
        # The second shape must reuse the first graph: dynamic batch and sequence.
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out = compiled(q, k, v)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        ref = attention(q, k, v)
        ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
        torch.testing.assert_close(out, ref)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r)


_LOAD_AND_RUN = textwrap.dedent(
    """
    import sys, torch
    import torch.nn.functional as F
    import neuralops_gqa  # registers the ops the saved graph calls
    ep = torch.export.load(sys.argv[1])
    device = sys.argv[2]
    for batch, seq in [(1, 5), (4, 37)]:
        q = torch.randn(batch, 8, seq, 16, device=device)
        k = torch.randn(batch, 2, seq, 16, device=device)
        v = torch.randn(batch, 2, seq, 16, device=device)
        out = ep.module()(q, k, v)
        ref = F.scaled_dot_product_attention(
            q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=True)
        torch.testing.assert_close(out, ref)
    print("ok", out.shape)
    """
)


class _Block(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v)


def test_export_save_load_fresh_process(backend: str, device: str, tmp_path: Path) -> None:
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2)
    dims = {0: batch, 2: seq}
    q, k, v = (x.detach() for x in _qkv(3, 20, device, seed=3))
    ep = torch.export.export(_Block(), (q, k, v), dynamic_shapes=(dims, dims, dims))
    assert "neuralops.gqa_expand.default" in str(ep.graph)
    # Decomposing to the core ATen set keeps the op whole: it has no decomposition to leak.
    decomposed = ep.run_decompositions()
    nodes = [n for n in decomposed.graph.nodes if n.target is torch.ops.neuralops.gqa_expand.default]
    assert len(nodes) == 1
    path = tmp_path / "block.pt2"
    torch.export.save(ep, path)
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_RUN, str(path), device],
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok torch.Size([4, 8, 37, 16])")

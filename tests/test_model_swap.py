"""A Llama-style attention block with its ``repeat_kv`` swapped for ours: same outputs and gradients."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import neuralops_gqa


def hf_style_repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """The formulation Hugging Face models use: a broadcast view and a copying reshape."""
    batch, kv_heads, seq, dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, dim)


class GQAttention(nn.Module):
    """Eager grouped-query attention as Llama/Mistral/Qwen2 write it (no RoPE), with a
    pluggable ``repeat_kv``."""

    def __init__(
        self, hidden: int, heads: int, kv_heads: int, repeat_kv: Callable[[Tensor, int], Tensor]
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(heads * self.dim, hidden, bias=False)
        self.repeat_kv = repeat_kv

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.dim).transpose(1, 2)
        n_rep = self.heads // self.kv_heads
        k, v = self.repeat_kv(k, n_rep), self.repeat_kv(v, n_rep)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.dim) + mask
        out = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (8, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
def test_swapped_repeat_kv_matches(backend: str, device: str, heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    ref = GQAttention(64, heads, kv_heads, hf_style_repeat_kv).to(device)
    ours = GQAttention(64, heads, kv_heads, neuralops_gqa.repeat_kv).to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 11, 64, device=device)
    # A causal mask with left padding on the first sequence.
    mask = torch.full((11, 11), float("-inf"), device=device).triu(1).expand(2, 1, 11, 11).clone()
    mask[0, :, :, :3] = float("-inf")
    mask[0, :, :3, :3] = torch.eye(3, device=device).log()
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out_ours = ref(x_ref, mask), ours(x_ours, mask)
    if kv_heads > 1:
        # The expansion is an exact copy, so everything downstream is the same arithmetic.
        torch.testing.assert_close(out_ours, out_ref, rtol=0, atol=0)
    else:
        # With one KV head the reference's reshape is a stride-0 view, which sends the
        # matmul down another BLAS path: float32 rounding differences, nothing more.
        torch.testing.assert_close(out_ours, out_ref, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(out_ref)
    out_ref.backward(grad)
    out_ours.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
    for (name, p_ref), p_ours in zip(ref.named_parameters(), ours.parameters()):
        # The group sums may add in another order than autograd's sum: float32 rounding.
        torch.testing.assert_close(p_ours.grad, p_ref.grad, rtol=1e-5, atol=1e-6, msg=name)

"""A Llama-style attention block with its ``repeat_kv`` swapped for ours: same outputs and gradients."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import neuralops_gqa
from helpers import Expand, GQAttention


def hf_style_repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """The formulation Hugging Face models use: a broadcast view and a copying reshape."""
    batch, kv_heads, seq, dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, dim)


def _pair(repeat_kv: Callable[[Tensor, int], Tensor]) -> Expand:
    return lambda k, v, kv_heads, heads: (repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads))


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (8, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
def test_swapped_repeat_kv_matches(backend: str, device: str, heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    ref = GQAttention(64, heads, kv_heads, _pair(hf_style_repeat_kv)).to(device)
    ours = GQAttention(64, heads, kv_heads, _pair(neuralops_gqa.repeat_kv)).to(device)
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

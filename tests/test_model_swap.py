"""A Llama-style attention block with its ``repeat_kv`` swapped for ours: same outputs and gradients."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import neuralops_gqa
from helpers import Expand, GQAttention
from neuralops_gqa.selfcheck import hf_repeat_kv


def _pair(repeat_kv: Callable[[Tensor, int], Tensor], strides: list[tuple[int, ...]]) -> Expand:
    """``repeat_kv`` on k and v as a block's expansion, recording the strides it returns."""

    def expand(k: Tensor, v: Tensor, kv_heads: int, heads: int) -> tuple[Tensor, Tensor]:
        k, v = repeat_kv(k, heads // kv_heads), repeat_kv(v, heads // kv_heads)
        strides.extend((k.stride(), v.stride()))
        return k, v

    return expand


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (8, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
def test_swapped_repeat_kv_matches(backend: str, device: str, heads: int, kv_heads: int) -> None:
    torch.manual_seed(0)
    ref_strides: list[tuple[int, ...]] = []
    our_strides: list[tuple[int, ...]] = []
    ref = GQAttention(64, heads, kv_heads, _pair(hf_repeat_kv, ref_strides)).to(device)
    ours = GQAttention(64, heads, kv_heads, _pair(neuralops_gqa.repeat_kv, our_strides)).to(device)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 11, 64, device=device)
    # A causal mask with left padding on the first sequence.
    mask = torch.full((11, 11), float("-inf"), device=device).triu(1).expand(2, 1, 11, 11).clone()
    mask[0, :, :, :3] = float("-inf")
    mask[0, :, :3, :3] = torch.eye(3, device=device).log()
    x_ref, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out_ours = ref(x_ref, mask), ours(x_ours, mask)
    # An exact copy in repeat_kv's layout, or (one KV head) the same broadcast view: the same
    # values with the same strides reach the same matmul, so the outputs are equal bit for bit
    # (a view and a copy of it may not be: matmul rounds them differently on some CPUs).
    assert our_strides == ref_strides and len(ref_strides) == 2
    torch.testing.assert_close(out_ours, out_ref, rtol=0, atol=0)
    grad = torch.randn_like(out_ref)
    out_ref.backward(grad)
    out_ours.backward(grad)
    torch.testing.assert_close(x_ours.grad, x_ref.grad, rtol=1e-6, atol=1e-6)
    for (name, p_ref), p_ours in zip(ref.named_parameters(), ours.parameters()):
        # The group sums may add in another order than autograd's sum: float32 rounding.
        torch.testing.assert_close(p_ours.grad, p_ref.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_one_kv_head_is_the_same_view(device: str) -> None:
    """With one KV head Hugging Face's repeat_kv copies nothing (a stride-0 view); ours
    returns the same view, so a consumer that reads views in place (SDPA) copies nothing."""
    x = torch.randn(2, 1, 5, 8, device=device)
    ours, theirs = neuralops_gqa.repeat_kv(x, 4), hf_repeat_kv(x, 4)
    assert ours.shape == theirs.shape and ours.stride() == theirs.stride() == (40, 0, 8, 1)
    assert ours.data_ptr() == x.data_ptr()


@pytest.mark.parametrize(("kv_heads", "n_rep"), [(2, 3), (1, 4), (3, 1)])
def test_hf_formulation_is_the_installed_transformers(kv_heads: int, n_rep: int) -> None:
    """The one copy of Hugging Face's repeat_kv the check and the benchmark compare with is
    the installed transformers' function: same values, same strides."""
    modeling_llama = pytest.importorskip(
        "transformers.models.llama.modeling_llama", reason="transformers is not installed"
    )
    x = torch.randn(2, kv_heads, 5, 8)
    ours, theirs = hf_repeat_kv(x, n_rep), modeling_llama.repeat_kv(x, n_rep)
    assert torch.equal(ours, theirs) and ours.stride() == theirs.stride()

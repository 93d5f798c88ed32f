"""``torch.vmap`` over the ops: one batched call (no per-sample loop), same results."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers import assert_bitwise_equal, assert_reduce_close


def _randn(*shape: int, device: str, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("in_dims", [(0, 0), (0, None), (None, 1), (2, 0)], ids=str)
def test_vmap_expand(backend: str, device: str, in_dims: tuple[int | None, int | None]) -> None:
    k, v = _randn(5, 2, 2, 3, 4, device=device), _randn(2, 5, 2, 3, 6, device=device, seed=1)
    k = k.movedim(0, in_dims[0]) if in_dims[0] is not None else k[0]
    v = v.movedim(1, in_dims[1]) if in_dims[1] is not None else v[:, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch's per-sample fallback warns; the rule must not need it
        out_k, out_v = torch.vmap(lambda k, v: torch.ops.neuralops.gqa_expand(k, v, 2, 6), in_dims=in_dims)(
            k, v
        )
    for out, x, dim in ((out_k, k, in_dims[0]), (out_v, v, in_dims[1])):
        per_sample = x.movedim(dim, 0) if dim is not None else x.expand(5, *x.shape)
        assert_bitwise_equal(out, per_sample.repeat_interleave(3, dim=2))


def test_vmap_reduce(backend: str, device: str) -> None:
    g = _randn(4, 2, 6, 3, 8, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = torch.vmap(lambda g: torch.ops.neuralops.gqa_reduce(g, g, 2, 6))(g)
    for i in range(4):
        assert_reduce_close(out[i], g[i], 2)


def test_gradcheck_batched_grad(backend: str, device: str) -> None:
    k = _randn(2, 2, 3, 4, device=device).double().requires_grad_()
    v = _randn(2, 2, 3, 5, device=device, seed=1).double().requires_grad_()

    def fn(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.neuralops.gqa_expand(k, v, 2, 4)

    assert torch.autograd.gradcheck(fn, (k, v), check_batched_grad=True, fast_mode=True)
    assert torch.autograd.gradgradcheck(fn, (k, v), check_batched_grad=True, fast_mode=True)

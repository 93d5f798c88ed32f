"""``torch.vmap`` over the ops: one batched call (no per-sample loop), same results."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_bitwise_equal, assert_reduce_close


def _randn(*shape: int, device: str, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("in_dims", [(0, 0), (0, None), (None, 1), (2, 0)], ids=str)
def test_vmap_expand(
    backend: str, device: str, in_dims: tuple[int | None, int | None], op_calls: list[tuple[str, torch.Size]]
) -> None:
    k, v = _randn(5, 2, 2, 3, 4, device=device), _randn(2, 5, 2, 3, 6, device=device, seed=1)
    k = k.movedim(0, in_dims[0]) if in_dims[0] is not None else k[0]
    v = v.movedim(1, in_dims[1]) if in_dims[1] is not None else v[:, 0]
    expand = torch.vmap(lambda k, v: torch.ops.neuralops.gqa_expand(k, v, 2, 6), in_dims=in_dims)
    out_k, out_v = expand(k, v)
    assert op_calls == [("gqa_expand", torch.Size([10, 2, 3, 4]))]
    for out, x, dim in ((out_k, k, in_dims[0]), (out_v, v, in_dims[1])):
        per_sample = x.movedim(dim, 0) if dim is not None else x.expand(5, *x.shape)
        assert_bitwise_equal(out, per_sample.repeat_interleave(3, dim=2))


def test_vmap_reduce(backend: str, device: str, op_calls: list[tuple[str, torch.Size]]) -> None:
    g = _randn(4, 2, 6, 3, 8, device=device)
    out, _ = torch.vmap(lambda g: torch.ops.neuralops.gqa_reduce(g, g, 2, 6))(g)
    assert op_calls == [("gqa_reduce", torch.Size([8, 6, 3, 8]))]
    for i in range(4):
        assert_reduce_close(out[i], g[i], 2)


def test_gradcheck_batched_grad(backend: str, device: str) -> None:
    k = _randn(2, 2, 3, 4, device=device).double().requires_grad_()
    v = _randn(2, 2, 3, 5, device=device, seed=1).double().requires_grad_()

    def fn(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.neuralops.gqa_expand(k, v, 2, 4)

    assert torch.autograd.gradcheck(fn, (k, v), check_batched_grad=True, fast_mode=True)
    assert torch.autograd.gradgradcheck(fn, (k, v), check_batched_grad=True, fast_mode=True)


@pytest.mark.parametrize("in_dims", [(0, 0), (None, 0), (0, None)], ids=str)
def test_vmap_over_an_empty_dim(backend: str, device: str, in_dims: tuple[int | None, int | None]) -> None:
    """A vmapped dim of size 0 gives an empty result of the right shape, as repeat_interleave
    does, for both ops and whichever input is vmapped."""
    k = _randn(0, 1, 2, 3, 4, device=device) if in_dims[0] == 0 else _randn(1, 2, 3, 4, device=device)
    v = _randn(0, 1, 2, 3, 5, device=device) if in_dims[1] == 0 else _randn(1, 2, 3, 5, device=device)
    out_k, out_v = torch.vmap(lambda a, b: torch.ops.neuralops.gqa_expand(a, b, 2, 4), in_dims=in_dims)(k, v)
    assert out_k.shape == (0, 1, 4, 3, 4) and out_v.shape == (0, 1, 4, 3, 5)
    g = _randn(0, 1, 4, 3, 4, device=device)
    out_g, _ = torch.vmap(lambda a: torch.ops.neuralops.gqa_reduce(a, a, 2, 4))(g)
    assert out_g.shape == (0, 1, 2, 3, 4)
    ref = torch.vmap(lambda a: a.repeat_interleave(2, 1))(_randn(0, 1, 2, 3, 4, device=device))
    assert ref.shape == out_k.shape


def test_nested_vmap_with_an_empty_dim(backend: str, device: str) -> None:
    x = _randn(3, 0, 1, 2, 3, 4, device=device)
    out, _ = torch.vmap(torch.vmap(lambda a: torch.ops.neuralops.gqa_expand(a, a, 2, 6)))(x)
    assert out.shape == (3, 0, 1, 6, 3, 4)
    x = _randn(0, 3, 1, 2, 3, 4, device=device)
    out, _ = torch.vmap(torch.vmap(lambda a: torch.ops.neuralops.gqa_expand(a, a, 2, 6)))(x)
    assert out.shape == (0, 3, 1, 6, 3, 4)

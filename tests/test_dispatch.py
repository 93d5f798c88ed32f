"""The eager fast path must step aside for everything that wraps or intercepts tensors."""

from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import assert_bitwise_equal, expand_oracle, make_tensor


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_dispatch_mode_sees_the_op(backend: str, device: str) -> None:
    k = make_tensor((2, 2, 3, 4), torch.float32, "contiguous", device)
    with _Recorder() as rec:
        k_out, _ = torch.ops.neuralops.gqa_expand(k, k, 2, 4)
    assert "neuralops.gqa_expand.default" in rec.seen
    assert_bitwise_equal(k_out, expand_oracle(k, 2))


def test_vmap_and_functionalize(backend: str, device: str) -> None:
    kb = torch.randn(5, 2, 2, 3, 4, generator=torch.Generator().manual_seed(0)).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no batching rule yet: PyTorch loops over the batch
        out, _ = torch.vmap(lambda k, v: torch.ops.neuralops.gqa_expand(k, v, 2, 4))(kb, kb)
    assert_bitwise_equal(out, kb.repeat_interleave(2, dim=2))
    k = kb[0]
    fn = torch.func.functionalize(lambda k: torch.ops.neuralops.gqa_expand(k, k, 2, 6)[0])
    assert_bitwise_equal(fn(k), expand_oracle(k, 3))


def test_grad_mode_and_requires_grad_routing(backend: str, device: str) -> None:
    k = make_tensor((1, 2, 3, 4), torch.float32, "contiguous", device).requires_grad_()
    out, _ = torch.ops.neuralops.gqa_expand(k, k.detach(), 2, 4)
    assert out.grad_fn is not None
    with torch.no_grad():
        out, _ = torch.ops.neuralops.gqa_expand(k, k.detach(), 2, 4)
    assert out.grad_fn is None and not out.requires_grad
    assert_bitwise_equal(out, expand_oracle(k.detach(), 2))

"""Tensors past 2^31 elements: the kernels' 64-bit offset path at full size.

The kernel-level test of the same path on a small input is in test_kernels.py; this one
needs about 12 GB of GPU memory with the Triton kernels, and more with the PyTorch
reference's float32 temporaries.
"""

from __future__ import annotations

import pytest
import torch

_NEEDED_BYTES = 48 * 2**30


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "tensors past 2^31 elements need a CUDA device (the interpreter would take hours)"
    free, _ = torch.cuda.mem_get_info()
    if free < _NEEDED_BYTES:
        return f"needs {_NEEDED_BYTES / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.1f} GiB free"
    return None


def test_expand_and_reduce_past_int32_offsets(backend: str) -> None:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    # B=9, 8 -> 64 heads, N=32768, D=128: 2.42e9 elements per output tensor (> 2^31).
    b, kv, heads, n, d = 9, 8, 64, 32768, 128
    n_rep = heads // kv
    gen = torch.Generator("cuda").manual_seed(0)
    k = torch.randn(b, kv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    # v as a transposed [B, N, H, D] projection: its strides reach past 2^31 too.
    v = torch.randn(b, n, kv, d, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, kv, heads)
    assert k_out.numel() > 2**31 and k_out.shape == (b, heads, n, d)
    # Every element, one output head at a time, and the very last element on its own.
    for h in range(heads):
        assert torch.equal(k_out[:, h], k[:, h // n_rep]), f"k head {h}"
        assert torch.equal(v_out[:, h], v[:, h // n_rep]), f"v head {h}"
    assert torch.equal(k_out[-1, -1, -1, -1], k[-1, -1, -1, -1])
    assert torch.equal(v_out[-1, -1, -1, -1], v[-1, -1, -1, -1])
    # Backward: each group sums n_rep equal copies, so the result is n_rep * input exactly
    # (a power of two times a bfloat16 value, accumulated in float32).
    g_k, g_v = torch.ops.neuralops.gqa_reduce(k_out, v_out, kv, heads)
    del k_out, v_out
    assert torch.equal(g_k, k * n_rep)
    assert torch.equal(g_v, v * n_rep)
    assert torch.equal(g_k[-1, -1, -1, -1], k[-1, -1, -1, -1] * n_rep)

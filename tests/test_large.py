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


# One KV head of >= 2^31 elements in a 2-D layout (a row stride, so (N, D) can't fold into
# one run): the 64-bit path is chosen, and every product of two scalars in an offset must be
# 64-bit too (rows * cols for an output head, rep * head stride in the reduction). These
# failed with an illegal memory access while those products were formed in 32 bits.
_HUGE_BYTES = 24 * 2**30


def _huge_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "heads of 2^31 elements need a CUDA device (the interpreter would take hours)"
    free, _ = torch.cuda.mem_get_info()
    if free < _HUGE_BYTES:
        return f"needs {_HUGE_BYTES / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.1f} GiB free"
    return None


def test_expand_one_huge_head_2d(backend: str) -> None:
    reason = _huge_skip_reason()
    if reason:
        pytest.skip(reason)
    row = torch.randint(1, 255, (1, 1, 1, 32768), dtype=torch.uint8, device="cuda")
    k = row.expand(1, 1, 65536, 32768)  # N * D = 2^31, row stride 0
    v = torch.empty(1, 1, 65536, 0, dtype=torch.uint8, device="cuda")
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, 1, 2)
    torch.cuda.synchronize()
    assert v_out.shape == (1, 2, 65536, 0)
    for h in range(2):  # every row of both output heads equals the row
        assert bool((k_out[0, h] == row[0, 0]).all()), f"head {h}"
    del k_out


def test_reduce_one_huge_head_2d(backend: str) -> None:
    reason = _huge_skip_reason()
    if reason:
        pytest.skip(reason)
    row = torch.randn(1, 1, 1, 32768, device="cuda").to(torch.bfloat16)
    # Two batch rows of 2 heads, each head 65536 x 32768 (2^31 elements) with row stride 0:
    # the result's second batch row starts at element 2^31.
    g = row.expand(2, 2, 65536, 32768)
    gk, gv = torch.ops.neuralops.gqa_reduce(g, g[..., :0], 1, 2)
    torch.cuda.synchronize()
    assert gv.shape == (2, 1, 65536, 0)
    expected = (row[0, 0].float() * 2).to(torch.bfloat16)  # exact: a sum of two equal values
    for b in range(2):
        assert bool((gk[b, 0] == expected).all()), f"batch {b}"


def test_reduce_head_stride_times_rep_past_int32(backend: str) -> None:
    """Head stride 2^29 with 8 heads a group: rep * stride reaches 3.7e9 while each scalar
    fits in 32 bits."""
    reason = _huge_skip_reason()
    if reason:
        pytest.skip(reason)
    stride_h = 2**29
    storage = torch.zeros(7 * stride_h + 64, dtype=torch.bfloat16, device="cuda")
    values = torch.randn(8, 64, device="cuda").to(torch.bfloat16)
    for h in range(8):
        storage[h * stride_h : h * stride_h + 64] = values[h]
    g = storage.as_strided((1, 8, 1024, 64), (0, stride_h, 0, 1))  # rows repeat: stride 0
    gk, _ = torch.ops.neuralops.gqa_reduce(g, g[..., :0], 1, 8)
    torch.cuda.synchronize()
    acc = values[0].float()
    for h in range(1, 8):  # the kernel's order: head 0, 1, ..., 7, in float32
        acc = acc + values[h].float()
    assert bool((gk[0, 0] == acc.to(torch.bfloat16)).all())

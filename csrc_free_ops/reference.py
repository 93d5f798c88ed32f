"""PyTorch reference for the GQA head expansion and its reduction.

It serves every device that has no Triton kernel (CPU, MPS, XPU, meta, ...) and is the
oracle the tests compare the kernels against. It validates nothing: the caller
(``neuralops_gqa.ops``) has already checked shapes, devices and dtypes.
"""

from __future__ import annotations

import torch
from torch import Tensor


def expand_reference(x: Tensor, n_rep: int) -> Tensor:
    """``[B, H_kv, N, D] -> [B, H_kv * n_rep, N, D]``, head ``h`` copying head ``h // n_rep``.

    Always a new contiguous tensor, whatever the strides of ``x``.
    """
    batch, kv_heads, seq, dim = x.shape
    out = x.new_empty((batch, kv_heads * n_rep, seq, dim))
    # A broadcasting copy reads each element of x once and writes each output once.
    out.view(batch, kv_heads, n_rep, seq, dim).copy_(x.unsqueeze(2))
    return out


def reduce_reference(grad: Tensor, num_kv_heads: int) -> Tensor:
    """``[B, H, N, D] -> [B, num_kv_heads, N, D]``: KV head ``j`` sums heads ``j*n_rep ... j*n_rep+n_rep-1``.

    Accumulates in float32 (float64 for float64 input) and returns the gradient's dtype,
    contiguous.
    """
    batch, heads, seq, dim = grad.shape
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    out = grad.new_empty((batch, num_kv_heads, seq, dim))
    # The sum keeps the gradient's strides; the copy makes the result contiguous.
    out.copy_(grad.unflatten(1, (num_kv_heads, heads // num_kv_heads)).sum(2, dtype=acc_dtype))
    return out

"""PyTorch reference for the GQA head expansion and its reduction.

It serves every device that has no Triton kernel (CPU, MPS, XPU, meta, ...) and is the
ATen form compilers and ``aten_decompositions()`` see. It validates nothing: the caller
(``neuralops_gqa``) has already checked shapes, devices and dtypes.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Sub-byte "shell" dtypes: a tensor of them stores one element per byte, and ATen has no
# copy kernel for them; their bytes are copied instead.
_SHELL_DTYPES = frozenset(
    getattr(torch, f"{kind}{bits}")
    for kind in ("int", "uint")
    for bits in range(1, 8)
    if hasattr(torch, f"{kind}{bits}")
)


def expand_reference(x: Tensor, n_rep: int) -> Tensor:
    """``[B, H_kv, N, D] -> [B, H_kv * n_rep, N, D]``, head ``h`` copying head ``h // n_rep``.

    Always a new contiguous tensor, whatever the strides of ``x``. Functional ATen ops only
    (a broadcast view and one copy), so it also serves as the op's decomposition for
    compilers and ATen-only backends.
    """
    if x.dtype in _SHELL_DTYPES:
        return expand_reference(x.view(torch.uint8), n_rep).view(x.dtype)
    batch, kv_heads, seq, dim = x.shape
    grouped = x.unsqueeze(2).expand(batch, kv_heads, n_rep, seq, dim)
    # One copy: each element of x read once, each output written once.
    return grouped.clone(memory_format=torch.contiguous_format).flatten(1, 2)


def reduce_reference(grad: Tensor, num_kv_heads: int) -> Tensor:
    """``[B, H, N, D] -> [B, num_kv_heads, N, D]``: KV head ``j`` sums heads ``j*n_rep ... j*n_rep+n_rep-1``.

    Accumulates in float32 (float64 for float64 input) and returns the gradient's dtype,
    contiguous. Functional ATen ops only, like ``expand_reference``.
    """
    heads = grad.shape[1]
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    summed: Tensor = grad.unflatten(1, (num_kv_heads, heads // num_kv_heads)).sum(2, dtype=acc_dtype)
    return summed.to(grad.dtype).contiguous()

"""PyTorch reference for the GQA head expansion and its reduction.

It serves every device that has no Triton kernel (CPU, MPS, XPU, meta, ...), eager calls
with ``NEURALOPS_GQA_BACKEND=torch``, and, in its functional form, compilers and
``aten_decompositions()``. It validates nothing: the caller (``neuralops_gqa``) has already
checked shapes, devices and dtypes.
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


def expand_reference(x: Tensor, n_rep: int, copies: bool | None = None) -> Tensor:
    """``[B, H_kv, N, D] -> [B, H_kv * n_rep, N, D]``, head ``h`` copying head ``h // n_rep``.

    A new contiguous tensor that is no view of another (so autograd lets the caller modify
    it in place), whatever the strides of ``x``: one copy, each element of ``x`` read once
    and each output element written once. ``copies``: what ``reshape_copies(x, n_rep)``
    says, where the caller knows it for ``x``'s sizes and strides (None: checked here).
    """
    batch, kv_heads, seq, dim = x.shape
    if x.dtype in _SHELL_DTYPES:  # ATen copies them as bytes only
        out = x.new_empty((batch, kv_heads * n_rep, seq, dim))
        grouped = x.view(torch.uint8).unsqueeze(2).expand(batch, kv_heads, n_rep, seq, dim)
        out.view(torch.uint8).view(batch, kv_heads, n_rep, seq, dim).copy_(grouped)
        return out
    # The same reshape as reshape_copies', written out: this is an eager call's hot path.
    out = x.unsqueeze(2).expand(batch, kv_heads, n_rep, seq, dim).reshape(batch, kv_heads * n_rep, seq, dim)
    if copies is None:
        copies = not _same_memory(out, x)
    return out if copies else out.clone(memory_format=torch.contiguous_format)


def reshape_copies(x: Tensor, n_rep: int) -> bool:
    """Whether ``expand_reference``'s reshape of ``x`` copies, rather than returning a view of
    ``x``'s memory (which it then copies). It depends on ``x``'s sizes and strides only.

    reshape copies the broadcast into a tensor of its own (no view) in ATen's fast copy
    kernel; where the broadcast is already laid out as the result (n_rep == 1, one KV head,
    heads of stride 0, no elements) it returns x's memory instead.
    """
    if x.dtype in _SHELL_DTYPES:
        return True  # copied as bytes, never through the reshape
    batch, kv_heads, seq, dim = x.shape
    out = x.unsqueeze(2).expand(batch, kv_heads, n_rep, seq, dim).reshape(batch, kv_heads * n_rep, seq, dim)
    return not _same_memory(out, x)


def _same_memory(a: Tensor, b: Tensor) -> bool:
    # Storage, not ``_base``: below autograd (the registered op's kernel) views aren't marked.
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def expand_functional(x: Tensor, n_rep: int) -> Tensor:
    """``expand_reference`` in functional ATen ops only (a broadcast view and one copy): the
    form compilers fuse with the copy's neighbours and ``aten_decompositions()`` exports."""
    if x.dtype in _SHELL_DTYPES:
        return expand_functional(x.view(torch.uint8), n_rep).view(x.dtype)
    batch, kv_heads, seq, dim = x.shape
    grouped = x.unsqueeze(2).expand(batch, kv_heads, n_rep, seq, dim)
    return grouped.clone(memory_format=torch.contiguous_format).flatten(1, 2)


# The sums' +0.0, made once (a Python float is wrapped into a tensor on every call, half of
# such an addition's host time). A 0-dim tensor takes part in type promotion like a Python
# scalar: the sum keeps the gradient's dtype, on any device.
_ZERO = torch.zeros((), dtype=torch.float32)
# The longest group ATen's CPU ``sum`` adds in order (tests/test_reduce_autograd.py holds it to that).
_CPU_SUM_IN_ORDER = 4


def reduce_reference(grad: Tensor, num_kv_heads: int) -> Tensor:
    """``[B, H, N, D] -> [B, num_kv_heads, N, D]``: KV head ``j`` sums heads ``j*n_rep ... j*n_rep+n_rep-1``.

    Accumulates in float32 (float64 for float64 input) in head order, one addition after
    the other from +0.0, as the Triton kernel does, so every backend rounds alike (ATen's
    ``sum`` may split a long reduced dim over several accumulators, and a group of -0.0
    sums to +0.0 here as there). Returns a new contiguous tensor of the gradient's dtype.
    Eager only: its additions are in place (``reduce_functional`` is the form for graphs).
    """
    batch, heads, seq, dim = grad.shape
    n_rep = heads // num_kv_heads
    # Splitting one dim is a view whatever the strides.
    groups = grad.view(batch, num_kv_heads, n_rep, seq, dim)
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    if n_rep <= _CPU_SUM_IN_ORDER and grad.is_cpu:
        # ATen's CPU sum adds a reduced dim this short one element after the other from +0.0,
        # whatever the layout and vector width (its interleaved accumulators start at 5): the
        # same sum in one call instead of n_rep.
        acc = groups.sum(2, dtype=acc_dtype)
        return acc if acc.dtype == grad.dtype else acc.to(grad.dtype)
    # unbind takes the n_rep heads of each group in one call.
    parts = groups.unbind(2)
    # +0.0 + x: exact, and -0.0 becomes +0.0. Where the gradient is contiguous and already
    # in the accumulator's dtype, an out-of-place add makes the accumulator, contiguous like
    # its input (no separate allocation, no final conversion: a third of a tiny reduction's
    # host time).
    if grad.dtype == acc_dtype and grad.is_contiguous():
        acc = torch.add(parts[0], _ZERO)
    else:
        acc = torch.empty((batch, num_kv_heads, seq, dim), dtype=acc_dtype, device=grad.device)
        torch.add(parts[0], _ZERO, out=acc)
    for part in parts[1:]:
        acc.add_(part)
    return acc if acc.dtype == grad.dtype else acc.to(grad.dtype)


def reduce_functional(grad: Tensor, num_kv_heads: int) -> Tensor:
    """``reduce_reference`` in functional ATen ops only, the same sum in the same order: the
    form compilers trace and ``aten_decompositions()`` exports (a decomposition may not
    mutate, not even a tensor of its own)."""
    batch, heads, seq, dim = grad.shape
    acc_dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32
    acc = torch.zeros((batch, num_kv_heads, seq, dim), dtype=acc_dtype, device=grad.device)
    for part in grad.view(batch, num_kv_heads, heads // num_kv_heads, seq, dim).unbind(2):
        acc = acc + part
    return acc.to(grad.dtype)

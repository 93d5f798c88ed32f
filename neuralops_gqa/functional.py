"""Public Python entry points: ``gqa_expand`` for k and v together, ``repeat_kv`` for one tensor."""

from __future__ import annotations

import torch
from torch import Tensor

from neuralops_gqa import eager
from neuralops_gqa.backend import backend
from neuralops_gqa.validation import check_head_counts, check_inputs, check_memory, check_tensor, integer


def gqa_expand(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    """Expand grouped-query KV heads to the query heads, for k and v in one kernel launch.

    Output head ``h`` is a copy of KV head ``h // (num_heads // num_kv_heads)``, the order of
    ``repeat_interleave(dim=1)`` and of ``scaled_dot_product_attention(..., enable_gqa=True)``.
    This is ``torch.ops.neuralops.gqa_expand`` except that nothing is copied when there is
    nothing to expand. Differentiable (the backward is ``torch.ops.neuralops.gqa_reduce``),
    and traceable by ``torch.compile`` and ``torch.export``.

    Args:
        k: ``[B, H_kv, N, D_k]``, any strides, any real dtype.
        v: ``[B, H_kv, N, D_v]``, any strides; its dtype and ``D_v`` may differ from k's, but
            ``B``, ``H_kv``, ``N`` and the device must match.
        num_kv_heads: ``H_kv``, positive, equal to ``k.shape[1]``; an int, or what
            ``operator.index`` takes (a numpy integer, a one-element integer tensor).
        num_heads: the query heads ``H``, a positive multiple of ``num_kv_heads``.

    Returns:
        ``(k_expanded, v_expanded)``, new contiguous ``[B, H, N, D_k]`` and ``[B, H, N, D_v]``
        tensors with the inputs' dtypes and device; when ``num_heads == num_kv_heads`` the
        inputs themselves, as Hugging Face's ``repeat_kv`` does.

    Raises:
        ValueError: a head count is not positive, ``num_heads`` is not a multiple of
            ``num_kv_heads``, ``k.shape[1] != num_kv_heads``, an input is not 4-D or is complex,
            or k and v disagree in ``B``, ``H_kv`` or ``N``.
        RuntimeError: k and v are on different devices.

    Example:
        >>> k, v = torch.randn(2, 8, 16, 64), torch.randn(2, 8, 16, 64)
        >>> k32, v32 = gqa_expand(k, v, 8, 32)
        >>> k32.shape, bool((k32[:, 5] == k[:, 1]).all())
        (torch.Size([2, 32, 16, 64]), True)
    """
    if not torch.compiler.is_compiling():
        # Plain eager calls: the kernels straight from a cached launch (neuralops_gqa.eager).
        plain = eager.expand(k, v, num_kv_heads, num_heads, alias=True)
        if plain is not None:
            return plain
    # Checked here too: the dispatcher's own error for a float or None names no argument, and
    # its parser would truncate a float tensor. A numpy integer becomes an int, which a
    # compiled caller can branch on.
    num_kv_heads, num_heads = check_head_counts("gqa_expand", num_kv_heads, num_heads)
    if num_heads == num_kv_heads:
        check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads)
        backend()  # a bad NEURALOPS_GQA_BACKEND fails every call, this one too
        return k, v
    expanded: tuple[Tensor, Tensor] = torch.ops.neuralops.gqa_expand(k, v, num_kv_heads, num_heads)
    return expanded


def repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """Drop-in for Hugging Face's ``repeat_kv``: ``[B, H_kv, N, D] -> [B, H_kv * n_rep, N, D]``.

    Head ``h`` of the result copies head ``h // n_rep``, like
    ``hidden_states.repeat_interleave(n_rep, dim=1)``. Only this one tensor is copied (the
    op's second input is a zero-width view). Same signature as the function in Hugging Face
    Transformers' Llama-style models, so it can replace it in place, and the same kind of
    result where Hugging Face's makes no copy: ``hidden_states`` itself for ``n_rep == 1``,
    and for one KV head a broadcast view (stride 0 over the heads), which SDPA reads in
    place and autograd reduces by its own sum; every other case is a new contiguous tensor
    from ``torch.ops.neuralops.gqa_expand``.

    Args:
        hidden_states: ``[B, H_kv, N, D]``, any strides, any real dtype.
        n_rep: how many copies of each head, a positive int (or what ``operator.index``
            takes, as for PyTorch's int arguments: a numpy integer, a one-element integer tensor).

    Returns:
        ``[B, H_kv * n_rep, N, D]``: a new contiguous tensor; ``hidden_states`` itself when
        ``n_rep == 1`` or ``H_kv == 0``; a view of it when ``H_kv == 1``.

    Raises:
        TypeError: ``hidden_states`` is not a tensor or ``n_rep`` not an int.
        ValueError: ``n_rep`` is not positive, ``hidden_states`` is not a 4-D dense tensor
            of a real dtype (whatever ``n_rep``, 1 included), or ``NEURALOPS_GQA_BACKEND``
            is not a known backend.

    Example:
        >>> x = torch.randn(1, 2, 3, 4)
        >>> bool((repeat_kv(x, 3) == x.repeat_interleave(3, dim=1)).all())
        True
    """
    if not torch.compiler.is_compiling():
        # Plain eager calls: one tensor launched from a cached launch (neuralops_gqa.eager).
        plain = eager.repeat(hidden_states, n_rep)
        if plain is not None:
            return plain
    if isinstance(hidden_states, torch.fx.Proxy):
        # torch.fx.symbolic_trace: one call of this function in the graph, as for Hugging Face's.
        proxy: Tensor = hidden_states.tracer.create_proxy(
            "call_function", repeat_kv, (hidden_states, n_rep), {}
        )
        return proxy
    # The op's own checks of the tensor, whatever the route, so n_rep == 1 or one KV head
    # can't pass what another call refuses.
    check_tensor("repeat_kv", "hidden_states", hidden_states)
    n_rep = integer("repeat_kv", "n_rep", n_rep)
    if n_rep < 1:
        message = f"repeat_kv: n_rep must be a positive int, got {n_rep}"
        torch._check_value(False, lambda: message)
    batch, kv_heads, seq, dim = hidden_states.shape
    if n_rep > 1 and kv_heads > 1 and not torch.compiler.is_compiling() and eager.memory_freed(hidden_states):
        check_memory("repeat_kv", "hidden_states", hidden_states)  # in its words, not the op's
    if n_rep == 1 or kv_heads <= 1:
        backend()  # a bad NEURALOPS_GQA_BACKEND fails every call, these too
        # No KV heads: the result is as empty as the input, and Hugging Face's is a view of it.
        return hidden_states if n_rep == 1 or kv_heads == 0 else hidden_states.expand(batch, n_rep, seq, dim)
    # The op's v: a zero-width tensor, no work. new_empty, not a slice: slicing a DTensor
    # sharded on the last dim (Shard(3)) to zero width gathers it from every rank first.
    no_v = hidden_states.new_empty((batch, kv_heads, seq, 0))
    out: Tensor  # torch.ops is untyped; the schema returns (Tensor, Tensor)
    out, _ = torch.ops.neuralops.gqa_expand(hidden_states, no_v, kv_heads, kv_heads * n_rep)
    return out

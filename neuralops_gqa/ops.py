"""The contract of ``torch.ops.neuralops.gqa_expand`` and ``torch.ops.neuralops.gqa_reduce``.

    gqa_expand(Tensor k, Tensor v, SymInt num_kv_heads, SymInt num_heads) -> (Tensor, Tensor)
    gqa_reduce(Tensor grad_k, Tensor grad_v, SymInt num_kv_heads, SymInt num_heads) -> (Tensor, Tensor)

Everything PyTorch is told about the two ops is registered here, in this order: the schemas
with their traced bodies (what compilers see of the ops), the fake implementations, the
autograd formulas and the batching rule, the eager kernels, and the ATen decomposition
table. The pieces live in modules named for them: ``validation`` (the one check of the
arguments), ``backend`` (the ``NEURALOPS_GQA_BACKEND`` switch), ``transforms`` (derivatives
and batching), ``eager`` (eager calls: the plain route and the registered kernels),
``private_internals`` (the private PyTorch internals these use, behind probes), and
``csrc_free_ops`` (the kernels and the reference, which register nothing).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from csrc_free_ops.reference import expand_functional, reduce_functional
from neuralops_gqa import eager, private_internals, transforms
from neuralops_gqa.backend import backend, triton_kernels, use_triton
from neuralops_gqa.validation import check_inputs

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch._library.custom_ops import CustomOpDef


def _expand_in_aten(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    n_rep = num_heads // num_kv_heads
    return expand_functional(k, n_rep), expand_functional(v, n_rep)


def _reduce_in_aten(
    grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    return reduce_functional(grad_k, num_kv_heads), reduce_functional(grad_v, num_kv_heads)


def _launches_kernel(x: Tensor) -> bool:
    """Whether the traced body of ``gqa_reduce`` launches our kernel for ``x``: on CUDA with
    the Triton backend (the Triton interpreter stays out of compiled code: it can't run on
    fake tensors)."""
    return x.is_cuda and use_triton(x)


# Dtypes Inductor generates no code for (any operation on them fails there, a view
# included): their expansion stays one opaque call of the eager kernel in compiled graphs.
_NO_INDUCTOR_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2")
    if hasattr(torch, name)
)


# A plain custom op (no decomposition): Inductor calls it back, as it does any custom op.
@torch.library.custom_op("neuralops::gqa_expand_opaque", mutates_args=())
def _gqa_expand_opaque(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    return eager.expand_impl(k, v, num_kv_heads, num_heads)


def _define(name: str, body: Callable[..., tuple[Tensor, Tensor]]) -> CustomOpDef:
    """The op ``neuralops::<name>``, whose body is what compilers see of it.

    A custom op plus one rule (what ``torch.library.triton_op`` is): when AOTDispatcher
    functionalizes a graph for a compiler (torch.compile's Inductor, AOTInductor), the op is
    replaced by its body, so the compiler fuses the ATen form (expansion) or launches our
    kernel from its own generated code (reduction on CUDA): no call back into Python, and an
    AOTInductor package that needs no Python. torch.export keeps the op whole (one readable,
    serializable node); ``aten_decompositions()`` and ``neuralops_gqa.onnx`` take it apart
    where a consumer needs standard ops. Eager calls never run the body: they go to
    ``eager``'s kernels, registered below. int annotations
    become SymInt, so dynamic head counts trace. The rule comes from the private internals
    (``triton_op`` itself imports Inductor and Triton when an op is defined, a second of
    ``import neuralops_gqa``); without them, ``triton_op``.
    """
    name = f"neuralops::{name}"
    decomposition = private_internals.compiler_decomposition(body)
    if decomposition is None:
        # Without Triton installed, triton_op logs a warning per op that there are no kernels
        # to find; there are none to find here either way (the body is ATen), so quietly.
        triton_log = logging.getLogger("torch._library.triton")
        level = triton_log.level
        triton_log.setLevel(logging.ERROR)
        try:
            defined: CustomOpDef = torch.library.triton_op(name, body, mutates_args=())  # type: ignore[assignment]
        finally:
            triton_log.setLevel(level)
        return defined
    op = torch.library.custom_op(name, body, mutates_args=())
    op.register_torch_dispatch(*decomposition)
    return op


def _expand_traced(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    """What compilers see of ``gqa_expand``: the reference's broadcasting copy in ATen ops."""
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads)
    backend()
    if k.dtype in _NO_INDUCTOR_DTYPES or v.dtype in _NO_INDUCTOR_DTYPES:
        opaque: tuple[Tensor, Tensor] = _gqa_expand_opaque(k, v, num_kv_heads, num_heads)
        return opaque
    # The reference's broadcasting copy, which Inductor fuses with the copy's neighbours (a
    # scale, a cast, attention's prologue) into one kernel; our kernel can't be fused, and
    # alone it only ties Inductor's copy (docs/design.md has the figures).
    return _expand_in_aten(k, v, num_kv_heads, num_heads)


gqa_expand = _define("gqa_expand", _expand_traced)
"""``[B, H_kv, N, D] -> [B, num_heads, N, D]`` for k and v: head ``h`` copies KV head ``h // n_rep``.

Registered as ``torch.ops.neuralops.gqa_expand``; call it through ``torch.ops`` (or
``neuralops_gqa.gqa_expand``). ``n_rep = num_heads // num_kv_heads``. The results are
always new tensors, also when ``n_rep == 1`` (a registered op may not return its inputs).
The backward is [`gqa_reduce`][neuralops_gqa.ops.gqa_reduce].

Args:
    k (Tensor): ``[B, H_kv, N, D_k]``, any strides, any real dtype.
    v (Tensor): ``[B, H_kv, N, D_v]``, any strides; dtype and ``D_v`` may differ from k's.
    num_kv_heads (int): ``H_kv``, positive, equal to ``k.shape[1]``.
    num_heads (int): a positive multiple of ``num_kv_heads``.

Returns ``(k_expanded, v_expanded)``: contiguous ``[B, num_heads, N, D_k]`` and
``[B, num_heads, N, D_v]`` tensors of the inputs' dtypes, bit-exact copies.

Raises:
    ValueError: bad shapes, head counts or dtypes (see
        [`check_inputs`][neuralops_gqa.validation.check_inputs]).
    RuntimeError: k and v on different devices.

Example:
    >>> k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 8)
    >>> k4, v4 = torch.ops.neuralops.gqa_expand(k, v, 2, 4)
    >>> tuple(v4.shape), bool((k4 == k.repeat_interleave(2, dim=1)).all())
    ((1, 4, 3, 8), True)
"""


def _reduce_traced(
    grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    """What compilers see of ``gqa_reduce``: our kernel on CUDA, the reference's in-order sum elsewhere."""
    check_inputs("gqa_reduce", ("grad_k", "grad_v"), grad_k, grad_v, num_kv_heads, num_heads)
    # Our kernel, launched through wrap_triton, which Inductor generates code for.
    if _launches_kernel(grad_k):
        return triton_kernels().reduce_backward(grad_k, grad_v, num_heads // num_kv_heads, traced=True)  # type: ignore[no-any-return]
    return _reduce_in_aten(grad_k, grad_v, num_kv_heads, num_heads)


gqa_reduce = _define("gqa_reduce", _reduce_traced)
"""``[B, num_heads, N, D] -> [B, H_kv, N, D]``: KV head ``j`` sums its group's ``n_rep`` heads.

Registered as ``torch.ops.neuralops.gqa_reduce``: the backward of
[`gqa_expand`][neuralops_gqa.ops.gqa_expand], and differentiable itself (its backward is
``gqa_expand``). Result head ``j`` is the sum of heads ``j*n_rep ... j*n_rep + n_rep - 1``,
accumulated in float32 (float64 for float64) in that order, without atomics, so the
result is deterministic, and rounded once to the gradient's dtype.

Args:
    grad_k (Tensor): ``[B, num_heads, N, D_k]``, any strides; float16, bfloat16, float32 or float64.
    grad_v (Tensor): ``[B, num_heads, N, D_v]``, any strides; dtype and ``D_v`` may differ from grad_k's.
    num_kv_heads (int): the result's heads, positive.
    num_heads (int): a positive multiple of ``num_kv_heads``, equal to ``grad_k.shape[1]``.

Returns ``(grad_k_reduced, grad_v_reduced)``: contiguous ``[B, num_kv_heads, N, D_k]`` and
``[B, num_kv_heads, N, D_v]`` tensors of the gradients' dtypes.

Raises:
    ValueError: bad shapes, head counts or dtypes.
    RuntimeError: the gradients on different devices.

Example:
    >>> g = torch.ones(1, 4, 3, 2)
    >>> gk, _ = torch.ops.neuralops.gqa_reduce(g, g, 2, 4)
    >>> tuple(gk.shape), gk[0, 0, 0, 0].item()
    ((1, 2, 3, 2), 2.0)
"""


def _key_compiled_graphs(x: Tensor) -> None:
    """Check the backend variable, and key AOTAutograd's cache of compiled graphs on the
    kernels the traced bodies launch for ``x``'s device: our reduction kernel (the backward
    of both ops) where ``gqa_reduce``'s body launches it, none otherwise. Tracing runs the
    fake implementations before that cache is looked up."""
    backend()
    kernels = [triton_kernels().reduce_bwd_kernel] if _launches_kernel(x) else []
    private_internals.record_triton_kernels(("neuralops::gqa_expand", "neuralops::gqa_reduce"), kernels)


# Fake implementations: shapes only, for FakeTensor/meta tracing (compile, export). They
# validate exactly like the real ones, so bad input fails at trace time with the same message.
@gqa_expand.register_fake
@_gqa_expand_opaque.register_fake
def _gqa_expand_fake(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads)
    _key_compiled_graphs(k)
    batch, _, seq, _ = k.shape
    return k.new_empty((batch, num_heads, seq, k.shape[3])), v.new_empty((batch, num_heads, seq, v.shape[3]))


@gqa_reduce.register_fake
def _gqa_reduce_fake(
    grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_reduce", ("grad_k", "grad_v"), grad_k, grad_v, num_kv_heads, num_heads)
    _key_compiled_graphs(grad_k)
    batch, _, seq, _ = grad_k.shape
    return (
        grad_k.new_empty((batch, num_kv_heads, seq, grad_k.shape[3])),
        grad_v.new_empty((batch, num_kv_heads, seq, grad_v.shape[3])),
    )


_OPS = (("gqa_expand", gqa_expand, eager.expand_impl), ("gqa_reduce", gqa_reduce, eager.reduce_impl))
_kernels_lib = torch.library.Library("neuralops", "IMPL")
for _name, _op, _impl in _OPS:
    # Each op's backward is the other op, so derivatives of every order work.
    _op.register_autograd(transforms.backward_of(_name), setup_context=transforms.setup_context)
    # vmap folds the vmapped dim into the batch: one launch, not a per-sample loop.
    _op.register_vmap(transforms.vmap_rule(_name))
    # Eager kernels straight on the CPU and CUDA keys: custom_op's own per-device wrapper
    # (a dynamo-disable context and an aliasing check on every call) costs microseconds an
    # eager call of a small shape can't spare, and the outputs are always fresh tensors.
    # Other devices run the body, i.e. the reference.
    for _key in ("CPU", "CUDA"):
        _kernels_lib.impl(_name, _impl, _key)
    # Strided nested tensors would otherwise meet the dispatcher's bare NotImplementedError;
    # the check refuses them by name.
    for _key in ("NestedTensorCPU", "NestedTensorCUDA"):
        _kernels_lib.impl(_name, functools.partial(check_inputs, _name, transforms.NAMES[_name]), _key)
    # The op's own autograd kernel where the private internals allow (eager.py says what it
    # adds); otherwise the register_autograd registration serves every call.
    _autograd = eager.autograd_kernel(_name)
    if _autograd is not None:
        for _key in ("AutogradCPU", "AutogradCUDA"):
            _kernels_lib.impl(_name, _autograd, _key, with_keyset=True)


def _refuse_jagged(cls: type, op: object, types: object, args: tuple[object, ...], kwargs: object) -> None:
    name = str(op).split(".")[1]
    raise ValueError(
        f"{name}: jagged nested tensors are not supported; the op takes dense [B, H, N, D] tensors "
        "(pad them, e.g. with to_padded_tensor(0), or call it on each sequence)"
    )


# Jagged nested tensors would otherwise raise PyTorch's bare NotImplementedError.
_jagged = private_internals.jagged_tensor_class()
if _jagged is not None and hasattr(torch.library, "register_torch_dispatch"):
    for _op_name in ("gqa_expand", "gqa_reduce"):
        torch.library.register_torch_dispatch(
            f"neuralops::{_op_name}", _jagged, _refuse_jagged, lib=_kernels_lib
        )


def aten_decompositions() -> dict[torch._ops.OperatorBase, Callable[..., tuple[Tensor, Tensor]]]:
    """Both ops in plain ATen ops, for backends that take ATen graphs only.

    ``torch.export`` keeps each op as one node; this table takes them apart:

        ep = ep.run_decompositions(neuralops_gqa.aten_decompositions())

    The result holds no ``neuralops`` node and needs neither this package nor Triton to run.
    The ATen form is the PyTorch reference: a broadcasting copy (forward) and a float32
    group sum (backward; float64 for float64), the same values as the ops.

    Example:
        >>> sorted(str(op) for op in aten_decompositions())
        ['neuralops.gqa_expand.default', 'neuralops.gqa_reduce.default']
    """
    return {
        torch.ops.neuralops.gqa_expand.default: _expand_in_aten,
        torch.ops.neuralops.gqa_reduce.default: _reduce_in_aten,
    }

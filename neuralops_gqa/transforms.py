"""The ops' derivatives and batching rule: what autograd, ``torch.func`` and ``torch.vmap`` use.

Both ops are linear and each is the other's adjoint: ``gqa_expand``'s backward is
``gqa_reduce`` and ``gqa_reduce``'s is ``gqa_expand``, so derivatives of any order are the
ops themselves, and a tangent goes through the same op as its primal (``jvp``). Each output
depends on one input only (k's expansion on k, v's on v).

``setup_context``/``backward`` are registered with ``register_autograd`` (``neuralops_gqa.ops``)
and serve the ``torch.autograd.Function`` that the op's own autograd kernel applies
(``neuralops_gqa.dispatch``), together with ``jvp``: that Function is what makes
``torch.func``'s transforms work through the op. ``vmap_rule`` is registered with
``register_vmap``: the vmapped dim folds into the batch dim, one launch for the whole batch.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from neuralops_gqa.validation import check_inputs

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import TypeAlias

    from torch._functorch.autograd_function import VmapInfo

    # A backward's result: gradients for k and v (or grad_k and grad_v), none for the head counts.
    Grads: TypeAlias = tuple[Tensor | None, Tensor | None, None, None]
    Pair: TypeAlias = tuple[Tensor, Tensor]
    Op: TypeAlias = Callable[[Tensor, Tensor, int, int], Pair]

NAMES = {"gqa_expand": ("k", "v"), "gqa_reduce": ("grad_k", "grad_v")}
ADJOINT = {"gqa_expand": "gqa_reduce", "gqa_reduce": "gqa_expand"}


def op_named(name: str) -> Op:
    """``torch.ops.neuralops.<name>.default``, looked up when called (after registration)."""
    op: Op = getattr(torch.ops.neuralops, name).default
    return op


class Ctx(Protocol):
    """The autograd context, as used here."""

    num_kv_heads: int
    num_heads: int
    inputs_meta: tuple[tuple[torch.Size, torch.dtype, torch.device], ...]
    differentiable: tuple[bool, ...]
    needs_input_grad: tuple[bool, ...]

    def mark_non_differentiable(self, *args: Tensor) -> None: ...

    def set_materialize_grads(self, value: bool) -> None: ...


def setup_context(ctx: Ctx, inputs: tuple[Tensor, Tensor, int, int], output: Pair) -> None:
    setup_context_for(ctx, inputs, output, ctx.needs_input_grad)


def setup_context_for(
    ctx: Ctx, inputs: tuple[Tensor, Tensor, int, int], output: Pair, differentiated: Sequence[bool]
) -> None:
    """``setup_context`` where ``differentiated[i]`` says whether input ``i`` is differentiated
    (it needs a gradient, or carries a forward-mode tangent)."""
    ctx.num_kv_heads, ctx.num_heads = inputs[2], inputs[3]
    # Shapes, not tensors: a tangent stand-in needs no reference to the inputs.
    ctx.inputs_meta = tuple((x.shape, x.dtype, x.device) for x in inputs[:2])
    # Each output depends on one input only: it is differentiable only where that input is.
    ctx.differentiable = tuple(
        wanted and (x.dtype.is_floating_point or x.dtype.is_complex)
        for wanted, x in zip(differentiated, inputs[:2])
    )
    ctx.mark_non_differentiable(*(out for out, wanted in zip(output, ctx.differentiable) if not wanted))
    # An output nobody used arrives as None instead of a materialised zero tensor.
    ctx.set_materialize_grads(False)


def pair_or_empty(a: Tensor | None, b: Tensor | None) -> Pair:
    """Stand in a zero-width tensor for a missing gradient: it passes the checks and costs nothing."""
    if a is None:
        assert b is not None
        a = _zero_width(b)
    if b is None:
        b = _zero_width(a)
    return a, b


def _zero_width(like: Tensor) -> Tensor:
    """``like`` cut to zero width: a view of it, so a compiled backward computes the stand-in
    from the gradient (an allocation depends on nothing, and the partitioner would move it
    into the forward and save it for the backward). A DTensor gets a new empty one: slicing a
    DTensor sharded on the last dim (Shard(3)) to zero width gathers it from every rank."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    is_dtensor = dtensor is not None and isinstance(like, dtensor)
    if is_dtensor:
        return like.new_empty((*like.shape[:3], 0))
    return like[..., :0]


def backward_of(name: str) -> Callable[[Ctx, Tensor | None, Tensor | None], Grads]:
    """The backward of op ``name``: its adjoint op on the gradients that are wanted."""
    adjoint = ADJOINT[name]

    def backward(ctx: Ctx, grad_a: Tensor | None, grad_b: Tensor | None) -> Grads:
        # Skip the work for an input that wants no gradient or an output nobody used.
        if not ctx.needs_input_grad[0]:
            grad_a = None
        if not ctx.needs_input_grad[1]:
            grad_b = None
        if grad_a is None and grad_b is None:
            return None, None, None, None
        out_a, out_b = op_named(adjoint)(*pair_or_empty(grad_a, grad_b), ctx.num_kv_heads, ctx.num_heads)
        return (None if grad_a is None else out_a), (None if grad_b is None else out_b), None, None

    return backward


def jvp_of(name: str) -> Callable[..., tuple[Tensor | None, Tensor | None]]:
    """The forward-mode derivative of op ``name``: the op itself, on the tangents.

    An input without a tangent gets zeros rather than a zero-width stand-in, so every
    differentiable output has a tangent of its own shape (functorch's forward-mode
    transforms over ``vmap`` set each output's tangent, and an undefined one there is an
    error); an output that is not differentiable (its input has no tangent and needs no
    gradient, or it is an integer or bool tensor) gets none.
    """

    def jvp(
        ctx: Ctx, tangent_a: Tensor | None, tangent_b: Tensor | None, *_: object
    ) -> tuple[Tensor | None, Tensor | None]:
        tangents = [
            t if t is not None else torch.zeros(shape, dtype=dtype, device=device)
            for t, (shape, dtype, device) in zip((tangent_a, tangent_b), ctx.inputs_meta)
        ]
        out = op_named(name)(tangents[0], tangents[1], ctx.num_kv_heads, ctx.num_heads)
        return tuple(o if wanted else None for o, wanted in zip(out, ctx.differentiable))  # type: ignore[return-value]

    return jvp


def _fold_batch(x: Tensor, dim: int | None, size: int) -> Tensor:
    x = x.movedim(dim, 0) if dim is not None else x.expand(size, *x.shape)
    return x.flatten(0, 1)


def _sample(x: Tensor, dim: int | None) -> Tensor:
    """What one vmap sample of ``x`` looks like to the checks (a view; for an empty vmap, an
    empty tensor of a sample's shape)."""
    if dim is None:
        return x
    if x.shape[dim]:
        return x.select(dim, 0)
    return x.new_empty((*x.shape[:dim], *x.shape[dim + 1 :]))


def vmap_rule(name: str) -> Callable[..., tuple[Pair, tuple[int, int]]]:
    """The batching rule of op ``name``: the vmapped dim folds into the batch dim (one call for
    the whole batch, not PyTorch's per-sample loop); an input that is not vmapped is broadcast."""
    names = NAMES[name]

    def rule(
        info: VmapInfo,
        in_dims: tuple[int | None, ...],
        a: Tensor,
        b: Tensor,
        num_kv_heads: int,
        num_heads: int,
    ) -> tuple[Pair, tuple[int, int]]:
        size = info.batch_size
        # Checked per sample first, so an error quotes the user's shapes, not the folded ones.
        sample_a, sample_b = _sample(a, in_dims[0]), _sample(b, in_dims[1])
        check_inputs(name, names, sample_a, sample_b, num_kv_heads, num_heads)
        out_a, out_b = op_named(name)(
            _fold_batch(a, in_dims[0], size), _fold_batch(b, in_dims[1], size), num_kv_heads, num_heads
        )
        batch = sample_a.shape[0]  # not out_a.shape[0] // size: the vmapped size may be 0
        return (out_a.unflatten(0, (size, batch)), out_b.unflatten(0, (size, batch))), (0, 0)

    return rule

"""How an eager call reaches the kernels: the device implementations and the autograd kernel.

The dispatcher takes a call of either op through its autograd kernel, then, below
autograd, through its device kernel:

- ``expand_impl``/``reduce_impl`` (the CPU and CUDA kernels): check the arguments, read the
  backend switch, run the Triton kernels or the PyTorch reference.
- ``autograd_kernel`` (the AutogradCPU and AutogradCUDA kernels, where the private internals
  allow): plain tensors that need no gradient go straight to the implementation (custom_op's
  Python autograd wrapper would cost more than the rest of a small call); everything else
  applies an ``autograd.Function`` built from ``neuralops_gqa.transforms``, with a ``jvp``
  (custom ops drop forward-mode tangents) and of the single-level kind that works inside
  ``torch.func``'s transforms. Without the internals, custom_op's own autograd kernel (the
  ``register_autograd`` registration) serves every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.autograd import forward_ad

from csrc_free_ops.reference import expand_reference, reduce_reference
from neuralops_gqa import private_internals, transforms
from neuralops_gqa.backend import triton_kernels, use_triton
from neuralops_gqa.validation import check_inputs

if TYPE_CHECKING:
    from collections.abc import Callable

    Impl = Callable[[Tensor, Tensor, int, int], tuple[Tensor, Tensor]]


def _refuse_tangents(op: str, a: Tensor, b: Tensor) -> None:
    """Without the op's own autograd kernel, a ``torch.autograd.forward_ad`` dual tensor gets
    an error, not zero tangents (outside a ``dual_level`` this reads nothing)."""
    if forward_ad.unpack_dual(a).tangent is not None or forward_ad.unpack_dual(b).tangent is not None:
        raise RuntimeError(
            f"{op}: forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) through this op "
            f"needs the op's own autograd kernel, which {private_internals.ENV}=0 turns off"
        )


def expand_impl(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads)
    if not private_internals.ENABLED:
        _refuse_tangents("gqa_expand", k, v)
    n_rep = num_heads // num_kv_heads
    if use_triton(k):
        return triton_kernels().expand_forward(k, v, n_rep)  # type: ignore[no-any-return]
    return expand_reference(k, n_rep), expand_reference(v, n_rep)


def reduce_impl(grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_reduce", ("grad_k", "grad_v"), grad_k, grad_v, num_kv_heads, num_heads)
    if not private_internals.ENABLED:
        _refuse_tangents("gqa_reduce", grad_k, grad_v)
    if use_triton(grad_k):
        return triton_kernels().reduce_backward(grad_k, grad_v, num_heads // num_kv_heads)  # type: ignore[no-any-return]
    return reduce_reference(grad_k, num_kv_heads), reduce_reference(grad_v, num_kv_heads)


def _has_tangent(x: Tensor) -> bool:
    # Level 0 explicitly: PyTorch has one forward-AD level, and a jvp that torch.compile
    # traces enters it without setting forward_ad's Python-side record of it.
    try:
        return forward_ad.unpack_dual(x, level=0).tangent is not None
    except (NotImplementedError, RuntimeError):  # sparse, quantized...: no tangents; the op refuses them
        return False


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    # The last input says which of k and v are differentiated (the kernel knows: forward-mode
    # tangents can't be read while apply() runs, it turns forward AD off).
    transforms.setup_context_for(ctx, inputs[:4], output, inputs[4][:2])


def autograd_kernel(name: str, impl: Impl) -> Callable[..., tuple[Tensor, Tensor]] | None:
    """Op ``name``'s autograd kernel (dispatch keyset first), or None where the internals are off."""
    internals = private_internals.autograd_internals()
    if internals is None:
        return None
    op = transforms.op_named(name)
    below_autograd, set_fwd_grad_enabled = internals.below_autograd, internals.set_fwd_grad_enabled

    def forward(
        a: Tensor, b: Tensor, num_kv_heads: int, num_heads: int, route: tuple[bool, bool, bool]
    ) -> tuple[Tensor, Tensor]:
        """``route``: whether k and v are differentiated, and whether the call may go straight
        to the implementation (plain tensors, no dispatch mode, no transform)."""
        if route[2]:
            return impl(a, b, num_kv_heads, num_heads)
        # apply() turns both gradient modes off for the forward; below autograd, a torch.func
        # transform's lower level needs them on (functorch's own rule for autograd.Function
        # does the same).
        with torch.enable_grad(), set_fwd_grad_enabled(True), below_autograd():
            return op(a, b, num_kv_heads, num_heads)

    backward = transforms.backward_of(name)

    def backward_with_flags(ctx: Any, grad_a: Tensor | None, grad_b: Tensor | None) -> tuple[Any, ...]:
        return (*backward(ctx, grad_a, grad_b), None)

    members = {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(_setup_context),
        "backward": staticmethod(backward_with_flags),
        "jvp": staticmethod(transforms.jvp_of(name)),
    }
    function: Any = type(f"{name}_function", (internals.single_level_function,), members)
    plain = internals.plain_keysets
    transforms_active, dispatch_modes = internals.transforms_active, internals.dispatch_modes
    allow_single_level, forward_ad_level = internals.allow_single_level, internals.forward_ad_level

    def kernel(
        keyset: torch._C.DispatchKeySet, a: Tensor | None, b: Tensor | None, num_kv_heads: int, num_heads: int
    ) -> tuple[Tensor, Tensor]:
        if a is None or b is None:  # the schema lets None through; the implementation names it
            return impl(a, b, num_kv_heads, num_heads)  # type: ignore[arg-type]
        if transforms_active():
            # Inside a torch.func transform both count as differentiated: a level's tensors
            # don't show whether they carry its tangent, and an unused derivative costs nothing.
            with allow_single_level():
                return function.apply(a, b, num_kv_heads, num_heads, (True, True, False))  # type: ignore[no-any-return]
        plain_keys = keyset.raw_repr() in plain
        grad = torch.is_grad_enabled()
        tangents = forward_ad_level() >= 0 or not plain_keys
        differentiated_a = (grad and a.requires_grad) or (tangents and _has_tangent(a))
        differentiated_b = (grad and b.requires_grad) or (tangents and _has_tangent(b))
        direct = plain_keys and dispatch_modes() == 0
        if differentiated_a or differentiated_b:
            route = (differentiated_a, differentiated_b, direct)
            return function.apply(a, b, num_kv_heads, num_heads, route)  # type: ignore[no-any-return]
        if direct:
            return impl(a, b, num_kv_heads, num_heads)
        with below_autograd():  # wrapped tensors, dispatch modes: every other key still runs
            return op(a, b, num_kv_heads, num_heads)

    return kernel

"""The contract of ``torch.ops.neuralops.gqa_expand`` and ``torch.ops.neuralops.gqa_reduce``.

Everything PyTorch needs to know about the two ops lives here, in this order: input
validation (shared by the real and fake implementations), backend choice, the schemas
with their real implementations, the fake implementations, and the autograd formulas.
The kernels themselves live in ``csrc_free_ops``; nothing there knows about
``torch.library``.

    gqa_expand(Tensor k, Tensor v, SymInt num_kv_heads, SymInt num_heads) -> (Tensor, Tensor)
    gqa_reduce(Tensor grad_k, Tensor grad_v, SymInt num_kv_heads, SymInt num_heads) -> (Tensor, Tensor)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from torch.autograd import forward_ad

from csrc_free_ops.reference import expand_reference, reduce_reference

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol, TypeAlias

    from torch._functorch.autograd_function import VmapInfo
    from torch._library.custom_ops import CustomOpDef

    # An op's implementation, and the same with the dispatch keyset first (an autograd kernel).
    _Impl: TypeAlias = Callable[[Tensor, Tensor, int, int], tuple[Tensor, Tensor]]
    _KeyedImpl: TypeAlias = Callable[[torch._C.DispatchKeySet, Tensor, Tensor, int, int], tuple[Tensor, ...]]

BACKEND_ENV = "NEURALOPS_GQA_BACKEND"
"""Environment variable read on every call: ``auto`` (default), ``triton`` or ``torch``.

``auto`` runs the Triton kernels on CUDA tensors and the PyTorch reference elsewhere;
``triton`` forces the kernels (on a CPU only with ``TRITON_INTERPRET=1``); ``torch`` forces
the reference.
"""
_BACKENDS = ("auto", "triton", "torch")
_REDUCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --- validation: one function, called by the real and the fake implementations ---------


def check_inputs(
    op: str,
    names: tuple[str, str],
    a: Tensor,
    b: Tensor,
    num_kv_heads: int,
    num_heads: int,
    concrete: bool = False,
) -> None:
    """Raise a ``ValueError``/``RuntimeError`` naming the argument if the op can't run.

    The one validation of both ops, called by their real and their fake implementations, so
    eager calls and traces under ``torch.compile``/``torch.export`` fail with the same
    message, e.g. ``gqa_expand: num_heads (30) must be a multiple of num_kv_heads (4)``.

    ``a`` and ``b`` are ``(k, v)`` for ``gqa_expand`` (head dim ``num_kv_heads``) and
    ``(grad_k, grad_v)`` for ``gqa_reduce`` (head dim ``num_heads``). Shape relations go
    through ``torch._check*`` so that symbolic shapes become runtime asserts, not guards.
    ``concrete=True`` (real tensors, plain ints) first tries one cheap test of everything
    and returns if it passes: the eager call is a hot path.
    """
    reduce = op == "gqa_reduce"
    for name, x in zip(names, (a, b)):
        if not isinstance(x, Tensor):  # the schema lets None through as an undefined tensor
            raise TypeError(f"{op}: {name} must be a Tensor, got {type(x).__name__}")
    if concrete:
        shape_a, shape_b = a.shape, b.shape
        if (
            len(shape_a) == 4
            and len(shape_b) == 4
            and num_kv_heads > 0
            and num_heads > 0
            and num_heads % num_kv_heads == 0
            and shape_a[1] == (num_heads if reduce else num_kv_heads)
            and shape_a[:3] == shape_b[:3]
            and a.device == b.device
            and a.layout == torch.strided
            and b.layout == torch.strided
            and not (a.is_quantized or b.is_quantized)
            and (
                (a.dtype in _REDUCE_DTYPES and b.dtype in _REDUCE_DTYPES)
                if reduce
                else not (a.dtype.is_complex or b.dtype.is_complex)
            )
        ):
            return
    for name, x in zip(names, (a, b)):
        _check_tensor(op, name, x, reduce)
    torch._check(
        a.device == b.device,
        lambda: f"{op}: {names[0]} and {names[1]} must be on one device, got {a.device} and {b.device}",
    )
    torch._check_value(num_kv_heads > 0, lambda: f"{op}: num_kv_heads must be positive, got {num_kv_heads}")
    torch._check_value(num_heads > 0, lambda: f"{op}: num_heads must be positive, got {num_heads}")
    torch._check_value(
        num_heads % num_kv_heads == 0,
        lambda: f"{op}: num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})",
    )
    head_arg, heads = ("num_heads", num_heads) if reduce else ("num_kv_heads", num_kv_heads)
    torch._check_value(
        a.shape[1] == heads,
        lambda: f"{op}: {names[0]}.shape[1] ({a.shape[1]}) must equal {head_arg} ({heads})",
    )
    for dim, what in ((0, "batch"), (1, "head"), (2, "sequence")):
        _check_same_dim(op, names, a, b, dim, what)


def _check_tensor(op: str, name: str, x: Tensor, reduce: bool) -> None:
    torch._check_value(
        x.dim() == 4, lambda: f"{op}: {name} must be 4-D [B, H, N, D], got shape {tuple(x.shape)}"
    )
    torch._check_value(
        x.layout == torch.strided and not x.is_quantized,
        lambda: f"{op}: {name} must be a dense tensor, got layout {x.layout} and dtype {x.dtype}",
    )
    if reduce:
        torch._check_value(
            x.dtype in _REDUCE_DTYPES,
            lambda: f"{op}: {name} must be float16, bfloat16, float32 or float64, got {x.dtype}",
        )
    else:
        torch._check_value(
            not x.dtype.is_complex, lambda: f"{op}: {name} must have a real dtype, got {x.dtype}"
        )


def _check_same_dim(op: str, names: tuple[str, str], a: Tensor, b: Tensor, dim: int, what: str) -> None:
    torch._check_value(
        a.shape[dim] == b.shape[dim],
        lambda: (
            f"{op}: {names[0]} and {names[1]} must agree in the {what} dim {dim}, "
            f"got {names[0]} {tuple(a.shape)} and {names[1]} {tuple(b.shape)}"
        ),
    )


# --- backend choice: read on every call, so tests and users can switch at run time ----

if TYPE_CHECKING:

    class _Kernels(Protocol):
        """What this module calls in ``csrc_free_ops.gqa_triton`` (the module satisfies it)."""

        def expand_forward(self, k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]: ...

        def reduce_backward(self, grad_k: Tensor, grad_v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]: ...


_triton_module: _Kernels | None = None


def _triton_kernels() -> _Kernels:
    """``csrc_free_ops.gqa_triton``, imported on first use so a CPU-only install needs no Triton."""
    global _triton_module
    if _triton_module is None:
        from csrc_free_ops import gqa_triton

        _triton_module = gqa_triton
    return _triton_module


def _use_triton(x: Tensor) -> bool:
    backend = os.environ.get(BACKEND_ENV, "auto")
    if backend == "auto":
        return x.is_cuda
    if backend == "torch":
        return False
    if backend == "triton":
        torch._check(
            x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1",
            lambda: (
                f"{BACKEND_ENV}=triton on a {x.device.type} tensor needs TRITON_INTERPRET=1 "
                "(the Triton interpreter) set before neuralops_gqa runs its first kernel"
            ),
        )
        return True
    raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(_BACKENDS)}, got {backend!r}")


# --- the ops ---------------------------------------------------------------------------


def _expand_impl(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads, concrete=True)
    n_rep = num_heads // num_kv_heads
    if _use_triton(k):
        return _triton_kernels().expand_forward(k, v, n_rep)
    return expand_reference(k, n_rep), expand_reference(v, n_rep)


def _reduce_impl(grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_reduce", ("grad_k", "grad_v"), grad_k, grad_v, num_kv_heads, num_heads, concrete=True)
    if _use_triton(grad_k):
        return _triton_kernels().reduce_backward(grad_k, grad_v, num_heads // num_kv_heads)
    return reduce_reference(grad_k, num_kv_heads), reduce_reference(grad_v, num_kv_heads)


# custom_op gives the schema, functionalization and the autograd plumbing in one place;
# int annotations become SymInt so dynamic head counts trace. Its implementation serves
# every device; CUDA gets a direct registration below.
@torch.library.custom_op("neuralops::gqa_expand", mutates_args=())
def gqa_expand(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    """``[B, H_kv, N, D] -> [B, num_heads, N, D]`` for k and v: head ``h`` copies KV head ``h // n_rep``.

    Registered as ``torch.ops.neuralops.gqa_expand``; call it through ``torch.ops`` (or
    ``neuralops_gqa.gqa_expand``). ``n_rep = num_heads // num_kv_heads``. The results are
    always new tensors, also when ``n_rep == 1`` (a registered op may not return its inputs).
    The backward is [`gqa_reduce`][neuralops_gqa.ops.gqa_reduce].

    Args:
        k: ``[B, H_kv, N, D_k]``, any strides, any real dtype.
        v: ``[B, H_kv, N, D_v]``, any strides; dtype and ``D_v`` may differ from k's.
        num_kv_heads: ``H_kv``, positive, equal to ``k.shape[1]``.
        num_heads: a positive multiple of ``num_kv_heads``.

    Returns:
        ``(k_expanded, v_expanded)``: contiguous ``[B, num_heads, N, D_k]`` and
        ``[B, num_heads, N, D_v]``, the inputs' dtypes, bit-exact copies.

    Raises:
        ValueError: bad shapes, head counts or dtypes (see
            [`check_inputs`][neuralops_gqa.ops.check_inputs]).
        RuntimeError: k and v on different devices.

    Example:
        >>> k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 8)
        >>> k4, v4 = torch.ops.neuralops.gqa_expand(k, v, 2, 4)
        >>> tuple(v4.shape), bool((k4 == k.repeat_interleave(2, dim=1)).all())
        ((1, 4, 3, 8), True)
    """
    return _expand_impl(k, v, num_kv_heads, num_heads)


@torch.library.custom_op("neuralops::gqa_reduce", mutates_args=())
def gqa_reduce(grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    """``[B, num_heads, N, D] -> [B, H_kv, N, D]``: KV head ``j`` sums its group's ``n_rep`` heads.

    Registered as ``torch.ops.neuralops.gqa_reduce``: the backward of
    [`gqa_expand`][neuralops_gqa.ops.gqa_expand], and differentiable itself (its backward is
    ``gqa_expand``). Result head ``j`` is the sum of heads ``j*n_rep ... j*n_rep + n_rep - 1``,
    accumulated in float32 (float64 for float64) in that order, without atomics, so the
    result is deterministic.

    Args:
        grad_k: ``[B, num_heads, N, D_k]``, any strides; float16, bfloat16, float32 or float64.
        grad_v: ``[B, num_heads, N, D_v]``, any strides; dtype and ``D_v`` may differ from grad_k's.
        num_kv_heads: the result's heads, positive.
        num_heads: a positive multiple of ``num_kv_heads``, equal to ``grad_k.shape[1]``.

    Returns:
        ``(grad_k_reduced, grad_v_reduced)``: contiguous ``[B, num_kv_heads, N, D_k]`` and
        ``[B, num_kv_heads, N, D_v]`` in the gradients' dtypes.

    Raises:
        ValueError: bad shapes, head counts or dtypes.
        RuntimeError: the gradients on different devices.

    Example:
        >>> g = torch.ones(1, 4, 3, 2)
        >>> gk, _ = torch.ops.neuralops.gqa_reduce(g, g, 2, 4)
        >>> tuple(gk.shape), gk[0, 0, 0, 0].item()
        ((1, 2, 3, 2), 2.0)
    """
    return _reduce_impl(grad_k, grad_v, num_kv_heads, num_heads)


# The CUDA kernels registered straight on the dispatcher's CUDA key: custom_op's own
# per-device wrapper (a dynamo-disable context and an aliasing check on every call) costs
# microseconds that an eager call of a small shape can't spare. The outputs are always
# fresh tensors, so the aliasing check has nothing to find.
_cuda_lib = torch.library.Library("neuralops", "IMPL")
_cuda_lib.impl("gqa_expand", _expand_impl, "CUDA")
_cuda_lib.impl("gqa_reduce", _reduce_impl, "CUDA")


# Fake implementations: shapes only, for FakeTensor/meta tracing (compile, export). They
# validate exactly like the real ones, so bad input fails at trace time with the same message.
@gqa_expand.register_fake
def _gqa_expand_fake(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads)
    batch, _, seq, _ = k.shape
    return k.new_empty((batch, num_heads, seq, k.shape[3])), v.new_empty((batch, num_heads, seq, v.shape[3]))


@gqa_reduce.register_fake
def _gqa_reduce_fake(
    grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_reduce", ("grad_k", "grad_v"), grad_k, grad_v, num_kv_heads, num_heads)
    batch, _, seq, _ = grad_k.shape
    return (
        grad_k.new_empty((batch, num_kv_heads, seq, grad_k.shape[3])),
        grad_v.new_empty((batch, num_kv_heads, seq, grad_v.shape[3])),
    )


if TYPE_CHECKING:

    class _Ctx(Protocol):
        """The autograd context custom_op passes to setup_context and backward, as used here."""

        num_kv_heads: int
        num_heads: int
        needs_input_grad: tuple[bool, ...]

        def mark_non_differentiable(self, *args: Tensor) -> None: ...

        def set_materialize_grads(self, value: bool) -> None: ...

    # A backward's result: gradients for k and v (or grad_k and grad_v), none for the head counts.
    _Grads: TypeAlias = tuple[Tensor | None, Tensor | None, None, None]


# Autograd: each op's backward is the other op, so double backward, gradcheck and
# gradgradcheck work to any order.
def _setup_context(ctx: _Ctx, inputs: tuple[Tensor, Tensor, int, int], output: tuple[Tensor, Tensor]) -> None:
    ctx.num_kv_heads, ctx.num_heads = inputs[2], inputs[3]
    # Each output depends on one input only: it needs no grad_fn unless that input does.
    ctx.mark_non_differentiable(*(out for out, needed in zip(output, ctx.needs_input_grad) if not needed))
    # An output nobody used arrives as None instead of a materialised zero tensor.
    ctx.set_materialize_grads(False)


def _pair_or_empty(grad_a: Tensor | None, grad_b: Tensor | None) -> tuple[Tensor, Tensor]:
    """Stand in a zero-width slice for a missing gradient: it passes the checks and costs nothing."""
    if grad_a is None:
        assert grad_b is not None
        grad_a = grad_b[..., :0]
    if grad_b is None:
        grad_b = grad_a[..., :0]
    return grad_a, grad_b


def _backward_through(
    op: CustomOpDef,
    ctx: _Ctx,
    grad_a: Tensor | None,
    grad_b: Tensor | None,
) -> _Grads:
    # Skip the work for an input that wants no gradient or an output nobody used.
    if not ctx.needs_input_grad[0]:
        grad_a = None
    if not ctx.needs_input_grad[1]:
        grad_b = None
    if grad_a is None and grad_b is None:
        return None, None, None, None
    out_a, out_b = op(*_pair_or_empty(grad_a, grad_b), ctx.num_kv_heads, ctx.num_heads)
    return (None if grad_a is None else out_a), (None if grad_b is None else out_b), None, None


def _expand_backward(ctx: _Ctx, grad_k: Tensor | None, grad_v: Tensor | None) -> _Grads:
    return _backward_through(gqa_reduce, ctx, grad_k, grad_v)


def _reduce_backward(ctx: _Ctx, grad_k: Tensor | None, grad_v: Tensor | None) -> _Grads:
    return _backward_through(gqa_expand, ctx, grad_k, grad_v)


gqa_expand.register_autograd(_expand_backward, setup_context=_setup_context)
gqa_reduce.register_autograd(_reduce_backward, setup_context=_setup_context)


# vmap: the vmapped dim folds into the batch dim, one launch for the whole batch (instead
# of PyTorch's per-sample loop). An input that is not vmapped is broadcast to the batch.
def _fold_batch(x: Tensor, dim: int | None, size: int) -> Tensor:
    x = x.movedim(dim, 0) if dim is not None else x.expand(size, *x.shape)
    return x.flatten(0, 1)


def _vmap_rule(op: CustomOpDef) -> Callable[..., tuple[tuple[Tensor, Tensor], tuple[int, int]]]:
    def rule(
        info: VmapInfo,
        in_dims: tuple[int | None, ...],
        a: Tensor,
        b: Tensor,
        num_kv_heads: int,
        num_heads: int,
    ) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        size = info.batch_size
        out_a, out_b = op(
            _fold_batch(a, in_dims[0], size), _fold_batch(b, in_dims[1], size), num_kv_heads, num_heads
        )
        batch = out_a.shape[0] // size
        return (out_a.unflatten(0, (size, batch)), out_b.unflatten(0, (size, batch))), (0, 0)

    return rule


gqa_expand.register_vmap(_vmap_rule(gqa_expand))
gqa_reduce.register_vmap(_vmap_rule(gqa_reduce))


# --- the autograd kernel ---------------------------------------------------------------
# custom_op's autograd kernel is Python that every call crosses, gradients or not (about
# 30 us of a 60 us eager call on the H200 host), and it drops forward-mode tangents
# (`torch.func.jvp`, `jacfwd`, `torch.autograd.forward_ad`) without a word. This kernel
# wraps it: plain tensors that need no gradient go straight to the implementation; inputs
# with tangents get theirs from the same op (both ops are linear, so the tangent of the
# output is the op applied to the tangents); everything else (inputs that require grad,
# tensor subclasses, dispatch modes, functionalization, functorch transforms, and tensors
# whose keys below autograd must act first: lazily negated or conjugated views, zero
# tensors, sparse, quantized and nested layouts) goes to custom_op's own kernel, built from
# the same registration, which redispatches through those keys.
_SLOW_PATH_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
for _key in (
    "Negative",
    "Conjugate",
    "ZeroTensor",
    "Sparse",
    "SparseCsr",
    "Quantized",
    "NestedTensor",
    "PythonTLSSnapshot",
    "PythonDispatcher",
    "Functionalize",
    "FuncTorchBatched",
    "FuncTorchGradWrapper",
    "FuncTorchVmapMode",
    "FuncTorchDynamicLayerFrontMode",
    "FuncTorchDynamicLayerBackMode",
):
    if hasattr(torch._C.DispatchKey, _key):  # not every key exists in every torch version
        _SLOW_PATH_KEYS = _SLOW_PATH_KEYS | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _key))


def _autograd_kernel(impl: _Impl, custom_op: CustomOpDef) -> _KeyedImpl:
    from torch._library.autograd import make_autograd_impl

    slow: _KeyedImpl = make_autograd_impl(custom_op._opoverload, custom_op)

    def with_tangents(
        keyset: torch._C.DispatchKeySet, a: Tensor, b: Tensor, num_kv_heads: int, num_heads: int
    ) -> tuple[Tensor, ...] | None:
        (pa, ta), (pb, tb) = forward_ad.unpack_dual(a), forward_ad.unpack_dual(b)
        if ta is None and tb is None:
            return None
        # The primals keep their backward history; the dual tensors would send custom_op's
        # autograd.Function, which has no jvp, into forward-mode AD and fail.
        out = slow(keyset, pa, pb, num_kv_heads, num_heads)
        tangents = custom_op(
            torch.zeros_like(pa) if ta is None else ta,
            torch.zeros_like(pb) if tb is None else tb,
            num_kv_heads,
            num_heads,
        )
        return tuple(forward_ad.make_dual(o, t) for o, t in zip(out, tangents))

    def autograd_kernel(
        keyset: torch._C.DispatchKeySet,
        a: Tensor | None,
        b: Tensor | None,
        num_kv_heads: int,
        num_heads: int,
    ) -> tuple[Tensor, ...]:
        if a is None or b is None:  # the schema lets None through; the implementation names it
            return impl(a, b, num_kv_heads, num_heads)  # type: ignore[arg-type]
        if forward_ad._current_level >= 0:
            out = with_tangents(keyset, a, b, num_kv_heads, num_heads)
            if out is not None:
                return out
        elif (
            (keyset & _SLOW_PATH_KEYS).raw_repr() == 0
            and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))
            and torch._C._len_torch_dispatch_stack() == 0
        ):
            return impl(a, b, num_kv_heads, num_heads)
        return slow(keyset, a, b, num_kv_heads, num_heads)

    return autograd_kernel


try:
    for _op, _impl in ((gqa_expand, _expand_impl), (gqa_reduce, _reduce_impl)):
        _kernel = _autograd_kernel(_impl, _op)
        for _dispatch_key in ("AutogradCUDA", "AutogradCPU"):
            _cuda_lib.impl(_op._name, _kernel, _dispatch_key, with_keyset=True)
except (ImportError, AttributeError, TypeError):  # a torch without these internals: custom_op's path serves
    pass

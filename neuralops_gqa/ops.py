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

from csrc_free_ops import private_internals
from csrc_free_ops.reference import expand_reference, reduce_reference

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Protocol, TypeAlias

    from torch._functorch.autograd_function import VmapInfo
    from torch._library.custom_ops import CustomOpDef

BACKEND_ENV = "NEURALOPS_GQA_BACKEND"
"""Environment variable read on every call: ``auto`` (default), ``triton`` or ``torch``.

``auto`` runs the Triton kernels on CUDA tensors and the PyTorch reference elsewhere;
``triton`` forces the kernels (on a CPU only with ``TRITON_INTERPRET=1``); ``torch`` forces
the reference. Case and surrounding blanks don't matter; any other value is a ``ValueError``
from every call, eager, traced or on meta tensors.
"""
_BACKENDS = ("auto", "triton", "torch")

_REDUCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def backend() -> str:
    """The backend ``NEURALOPS_GQA_BACKEND`` asks for, normalised; a ``ValueError`` if unknown."""
    raw = os.environ.get(BACKEND_ENV)
    if raw is None:
        return "auto"
    name = raw.strip().lower()
    if name not in _BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(_BACKENDS)}, got {raw!r}")
    return name


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
    backend()
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
    _require(
        a.device == b.device,
        f"{op}: {names[0]} and {names[1]} must be on one device, got {a.device} and {b.device}",
        RuntimeError,
    )
    _require(num_kv_heads > 0, f"{op}: num_kv_heads must be positive, got {num_kv_heads}")
    _require(num_heads > 0, f"{op}: num_heads must be positive, got {num_heads}")
    _require(
        num_heads % num_kv_heads == 0,
        f"{op}: num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})",
    )
    head_arg, heads = ("num_heads", num_heads) if reduce else ("num_kv_heads", num_kv_heads)
    _require(a.shape[1] == heads, f"{op}: {names[0]}.shape[1] ({a.shape[1]}) must equal {head_arg} ({heads})")
    for dim, what in ((0, "batch"), (1, "head"), (2, "sequence")):
        _require(
            a.shape[dim] == b.shape[dim],
            f"{op}: {names[0]} and {names[1]} must agree in the {what} dim {dim}, "
            f"got {names[0]} {tuple(a.shape)} and {names[1]} {tuple(b.shape)}",
        )


def _require(cond: bool, message: str, error: type[Exception] = ValueError) -> None:
    """``torch._check_value`` (``ValueError``) or ``torch._check`` (``RuntimeError``) with ``message``.

    Messages are formatted before the check, so the closure holds a constant and
    ``torch.compile`` can trace it; the fast path of ``check_inputs`` keeps this formatting
    off an eager call's hot path.
    """
    if not isinstance(
        cond, torch.SymBool
    ):  # settled: a plain raise (torch 2.11's dynamo can't trace the closure)
        if not cond:
            raise error(message)
    elif error is ValueError:
        torch._check_value(cond, lambda: message)
    else:
        torch._check(cond, lambda: message)


def _check_tensor(op: str, name: str, x: Tensor, reduce: bool) -> None:
    _require(x.dim() == 4, f"{op}: {name} must be 4-D [B, H, N, D], got shape {tuple(x.shape)}")
    _require(
        x.layout == torch.strided and not x.is_quantized,
        f"{op}: {name} must be a dense tensor, got layout {x.layout} and dtype {x.dtype}",
    )
    if reduce:
        _require(
            x.dtype in _REDUCE_DTYPES,
            f"{op}: {name} must be float16, bfloat16, float32 or float64, got {x.dtype}",
        )
    else:
        _require(not x.dtype.is_complex, f"{op}: {name} must have a real dtype, got {x.dtype}")


# --- backend choice: read on every call, so tests and users can switch at run time ----

if TYPE_CHECKING:

    class _Kernels(Protocol):
        """What this module calls in ``csrc_free_ops.gqa_triton`` (the module satisfies it)."""

        def expand_forward(
            self, k: Tensor, v: Tensor, n_rep: int, traced: bool = False
        ) -> tuple[Tensor, Tensor]: ...

        def reduce_backward(
            self, grad_k: Tensor, grad_v: Tensor, n_rep: int, traced: bool = False
        ) -> tuple[Tensor, Tensor]: ...


_triton_module: _Kernels | None = None


def _triton_kernels() -> _Kernels:
    """``csrc_free_ops.gqa_triton``, imported on first use so a CPU-only install needs no Triton."""
    global _triton_module
    if _triton_module is None:
        from csrc_free_ops import gqa_triton

        _triton_module = gqa_triton
    return _triton_module


def _use_triton(x: Tensor) -> bool:
    choice = backend()
    if choice == "auto":
        return x.is_cuda
    if choice == "torch":
        return False
    torch._check(
        x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1",
        lambda: (
            f"{BACKEND_ENV}=triton on a {x.device.type} tensor needs TRITON_INTERPRET=1 "
            "(the Triton interpreter) set before neuralops_gqa runs its first kernel"
        ),
    )
    return True


# --- the ops ---------------------------------------------------------------------------


def _refuse_tangents(op: str, a: Tensor, b: Tensor) -> None:
    """Forward-mode AD without the private fast path: ``torch.autograd.forward_ad`` dual
    tensors get an error, not zero tangents (outside a ``dual_level`` this reads nothing)."""
    if forward_ad.unpack_dual(a).tangent is not None or forward_ad.unpack_dual(b).tangent is not None:
        raise RuntimeError(
            f"{op}: forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) through this op "
            f"needs the op's own autograd kernel, which {private_internals.ENV}=0 turns off"
        )


def _expand_impl(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    """The eager implementation on real tensors: the Triton kernels or the reference."""
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads, concrete=True)
    if not private_internals.ENABLED:
        _refuse_tangents("gqa_expand", k, v)
    n_rep = num_heads // num_kv_heads
    if _use_triton(k):
        return _triton_kernels().expand_forward(k, v, n_rep)
    return expand_reference(k, n_rep), expand_reference(v, n_rep)


def _reduce_impl(grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_reduce", ("grad_k", "grad_v"), grad_k, grad_v, num_kv_heads, num_heads, concrete=True)
    if not private_internals.ENABLED:
        _refuse_tangents("gqa_reduce", grad_k, grad_v)
    if _use_triton(grad_k):
        return _triton_kernels().reduce_backward(grad_k, grad_v, num_heads // num_kv_heads)
    return reduce_reference(grad_k, num_kv_heads), reduce_reference(grad_v, num_kv_heads)


# What a compiler sees when it takes the op apart (see the op definitions below). The
# expansion: the reference's broadcasting copy in ATen ops, which Inductor fuses with the
# copy's neighbours (a scale, a cast, attention's prologue) into one kernel; our kernel
# can't be fused, and alone it only ties Inductor's copy (docs/design.md has the figures).
# The reduction on CUDA with the Triton backend: our kernel, launched through
# ``wrap_triton``, which Inductor generates code for; elsewhere the reference, in ATen ops
# Inductor lowers itself. The Triton interpreter stays out of compiled code: it can't run
# on fake tensors.
#
# True gives compiled graphs our expansion kernel instead: how the benchmark measures the
# choice. Inductor's caches don't key on it: compile with them off (bench.compiled_form).
_compiled_expand_kernel = False


def _expand_in_aten(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    n_rep = num_heads // num_kv_heads
    return expand_reference(k, n_rep), expand_reference(v, n_rep)


def _reduce_in_aten(
    grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    return reduce_reference(grad_k, num_kv_heads), reduce_reference(grad_v, num_kv_heads)


def _expand_traceable(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads)
    if _compiled_expand_kernel and k.is_cuda and _use_triton(k):
        return _triton_kernels().expand_forward(k, v, num_heads // num_kv_heads, traced=True)
    return _expand_in_aten(k, v, num_kv_heads, num_heads)


def _reduce_traceable(
    grad_k: Tensor, grad_v: Tensor, num_kv_heads: int, num_heads: int
) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_reduce", ("grad_k", "grad_v"), grad_k, grad_v, num_kv_heads, num_heads)
    if grad_k.is_cuda and _use_triton(grad_k):
        return _triton_kernels().reduce_backward(grad_k, grad_v, num_heads // num_kv_heads, traced=True)
    return _reduce_in_aten(grad_k, grad_v, num_kv_heads, num_heads)


# triton_op is custom_op plus one rule: when AOTDispatcher functionalizes a graph for a
# compiler (torch.compile's Inductor, AOTInductor), the op is replaced by its body, so the
# compiler launches our kernels from its own generated code (or lowers the reference):
# no call back into Python, and an AOTInductor package that needs no Python. torch.export
# keeps the op whole (one readable, serializable node); ``aten_decompositions()`` and
# ``neuralops_gqa.onnx`` take it apart where a consumer needs standard ops. The body is
# what the compiler sees; eager calls go to ``_expand_impl`` (registered per device below).
# int annotations become SymInt, so dynamic head counts trace.
@torch.library.triton_op("neuralops::gqa_expand", mutates_args=())
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
    return _expand_traceable(k, v, num_kv_heads, num_heads)


@torch.library.triton_op("neuralops::gqa_reduce", mutates_args=())
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
    return _reduce_traceable(grad_k, grad_v, num_kv_heads, num_heads)


# Eager kernels per device. With the private fast paths on, straight on the dispatcher's
# CPU and CUDA keys: custom_op's own per-device wrapper (a dynamo-disable context and an
# aliasing check on every call) costs microseconds that an eager call of a small shape
# can't spare, and the outputs are always fresh tensors, so the aliasing check has nothing
# to find. Other devices run the body, i.e. the reference.
_kernels_lib = torch.library.Library("neuralops", "IMPL")
_OPS = (("gqa_expand", gqa_expand, _expand_impl), ("gqa_reduce", gqa_reduce, _reduce_impl))
for _name, _op, _impl in _OPS:
    for _device in ("cpu", "cuda"):
        if private_internals.ENABLED:
            _kernels_lib.impl(_name, _impl, _device.upper())
        else:
            _op.register_kernel(_device, _impl)


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


# Fake implementations: shapes only, for FakeTensor/meta tracing (compile, export). They
# validate exactly like the real ones, so bad input fails at trace time with the same message.
@gqa_expand.register_fake  # type: ignore[untyped-decorator]  # triton_op is typed as a plain Callable
def _gqa_expand_fake(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
    check_inputs("gqa_expand", ("k", "v"), k, v, num_kv_heads, num_heads)
    batch, _, seq, _ = k.shape
    return k.new_empty((batch, num_heads, seq, k.shape[3])), v.new_empty((batch, num_heads, seq, v.shape[3]))


@gqa_reduce.register_fake  # type: ignore[untyped-decorator]
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
    # new_empty, not a slice: slicing a DTensor sharded on the last dim (Shard(3)) to zero
    # width gathers it from every rank first.
    if grad_a is None:
        assert grad_b is not None
        grad_a = grad_b.new_empty((*grad_b.shape[:3], 0))
    if grad_b is None:
        grad_b = grad_a.new_empty((*grad_a.shape[:3], 0))
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


def _refuse_jagged(cls: type, op: object, types: object, args: tuple[object, ...], kwargs: object) -> None:
    name = str(op).split(".")[1]
    raise ValueError(
        f"{name}: jagged nested tensors are not supported; the op takes dense [B, H, N, D] tensors "
        "(pad them, e.g. with to_padded_tensor(0), or call it on each sequence)"
    )


# Jagged nested tensors would otherwise raise PyTorch's bare NotImplementedError.
_jagged = private_internals.jagged_tensor_class()
if _jagged is not None and hasattr(torch.library, "register_torch_dispatch"):
    for _name, _op, _ in _OPS:
        torch.library.register_torch_dispatch(
            f"neuralops::{_name}", _jagged, _refuse_jagged, lib=_kernels_lib
        )


# vmap: the vmapped dim folds into the batch dim, one launch for the whole batch (instead
# of PyTorch's per-sample loop). An input that is not vmapped is broadcast to the batch.
def _fold_batch(x: Tensor, dim: int | None, size: int) -> Tensor:
    x = x.movedim(dim, 0) if dim is not None else x.expand(size, *x.shape)
    return x.flatten(0, 1)


def _sample(x: Tensor, dim: int | None) -> Tensor:
    """One vmap sample of ``x`` (a view)."""
    return x if dim is None else x.select(dim, 0)


# The checks as a sample sees them, so an error under vmap quotes the user's shapes and not
# the folded ones (bound once here: the op's own check_inputs stays the one per call).
_check_sample = check_inputs


def _vmap_rule(
    op: CustomOpDef, name: str, names: tuple[str, str]
) -> Callable[..., tuple[tuple[Tensor, Tensor], tuple[int, int]]]:
    def rule(
        info: VmapInfo,
        in_dims: tuple[int | None, ...],
        a: Tensor,
        b: Tensor,
        num_kv_heads: int,
        num_heads: int,
    ) -> tuple[tuple[Tensor, Tensor], tuple[int, int]]:
        size = info.batch_size
        if size:  # an empty vmap has no sample to show; the folded call still checks
            _check_sample(
                name, names, _sample(a, in_dims[0]), _sample(b, in_dims[1]), num_kv_heads, num_heads
            )
        out_a, out_b = op(
            _fold_batch(a, in_dims[0], size), _fold_batch(b, in_dims[1], size), num_kv_heads, num_heads
        )
        batch = out_a.shape[0] // size
        return (out_a.unflatten(0, (size, batch)), out_b.unflatten(0, (size, batch))), (0, 0)

    return rule


gqa_expand.register_vmap(_vmap_rule(gqa_expand, "gqa_expand", ("k", "v")))
gqa_reduce.register_vmap(_vmap_rule(gqa_reduce, "gqa_reduce", ("grad_k", "grad_v")))


# --- the autograd kernel ---------------------------------------------------------------
# custom_op's autograd kernel is Python that every call crosses, gradients or not (about
# 30 us of a 60 us eager call on the H200 host), and it drops forward-mode tangents
# (`torch.func.jvp`, `jacfwd`, `torch.autograd.forward_ad`) without a word. The fast kernel
# (csrc_free_ops.private_internals) sends plain tensors that need no gradient straight to
# the implementation, computes tangents, and leaves everything else to custom_op's kernel.
for _name, _op, _impl in _OPS:
    _kernel = private_internals.autograd_kernel(_impl, _op)
    if _kernel is not None:
        for _dispatch_key in ("AutogradCUDA", "AutogradCPU"):
            _kernels_lib.impl(_name, _kernel, _dispatch_key, with_keyset=True)

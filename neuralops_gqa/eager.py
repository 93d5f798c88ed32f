"""Eager calls of the ops: the guard, the cached launch, its autograd, and the registered kernels.

A call is *plain* when its tensors are plain dense CPU or CUDA tensors, its head counts
ints, and nothing watches or transforms it: no torch.compile or torch.export trace, no
dispatch or torch-function mode, no ``torch.func`` transform, no forward-AD level, no
profiler. A plain call runs here from a cache keyed on its arguments' layout (shapes,
strides, dtypes, devices, head counts, ``NEURALOPS_GQA_BACKEND``): the first call of a layout
checks the arguments (``neuralops_gqa.validation``) and picks the kernels; every call then
allocates its results and launches (``csrc_free_ops``). Where gradients are wanted, one
``autograd.Function`` runs the same launch, and its backward launches the reduction the
same way. That is the whole host path of an eager call: no dispatcher hop from the Python
entry points, one from ``torch.ops.neuralops.*``.

Every other call goes to the registered op (``neuralops_gqa.ops``), which compilers,
exporters, modes, transforms and tensor subclasses see: its autograd kernel
(``autograd_kernel``) applies an ``autograd.Function`` made from ``neuralops_gqa.transforms``
(with a ``jvp``, of the single-level kind that works inside ``torch.func``), and its device
kernels (``expand_impl``, ``reduce_impl``) run the same cached launches. Both routes check
the same rules and run the same kernels, so they give the same bits.

Without the private internals (``NEURALOPS_GQA_PRIVATE_INTERNALS=0``) no call is plain:
every call takes the registered op with custom_op's own autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd import forward_ad

from csrc_free_ops.private_internals import ENABLED, ENV
from csrc_free_ops.reference import expand_reference, reduce_reference, reshape_copies
from neuralops_gqa import private_internals, transforms
from neuralops_gqa.backend import BACKEND_ENV, backend, triton_kernels, use_triton
from neuralops_gqa.validation import check_inputs, check_memory, check_tensor

Pair = tuple[Tensor, Tensor]
# (a, b or None) -> (a's result, b's result or None)
Run = Callable[[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]

_internals = private_internals.autograd_internals()


Strides = tuple[int, ...] | None
NO_STRIDES: tuple[Strides, Strides] = (None, None)


class _Entry:
    """What the calls of one argument layout share: the checked head counts, the launch and,
    for an expansion, the strides its inputs' gradients take (``gradient_strides``)."""

    __slots__ = ("grad_strides", "num_heads", "num_kv_heads", "run")

    def __init__(
        self, run: Run, num_kv_heads: int, num_heads: int, grad_strides: tuple[Strides, Strides] = NO_STRIDES
    ) -> None:
        self.run, self.num_kv_heads, self.num_heads = run, num_kv_heads, num_heads
        self.grad_strides = grad_strides


def gradient_strides(x: Tensor) -> Strides:
    """The strides the plain route gives ``x``'s gradient, None for contiguous ones: ``x``'s
    own where ``torch.empty_like`` keeps them (a dense tensor; autograd wants a leaf's
    gradient laid out so) and its last dim is innermost, but it isn't contiguous. The
    ``[B, N, H, D]`` projection's transposed view that attention layers expand then gets a
    gradient the projection's backward reads without a copy. Once per layout (the entry)."""
    if x.is_contiguous() or (x.stride(3) != 1 and x.shape[3] > 1) or not x.numel():
        return None
    stride = x.stride()
    return stride if torch.empty_like(x, device="meta").stride() == stride else None


def _reference_run(
    op: str,
    a: Tensor,
    b: Tensor | None,
    num_kv_heads: int,
    num_heads: int,
    out_strides: tuple[Strides, Strides],
) -> Run:
    if op == "gqa_expand":
        n_rep = num_heads // num_kv_heads
        # Decided once for the layout (the entry's key): whether the reshape copies by itself.
        copies_a, copies_b = reshape_copies(a, n_rep), b is None or reshape_copies(b, n_rep)

        def expand(a: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
            return (expand_reference(a, n_rep, copies_a),
                    None if b is None else expand_reference(b, n_rep, copies_b))  # fmt: skip

        return expand

    def reduce(a: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
        return reduce_reference(a, num_kv_heads), None if b is None else reduce_reference(b, num_kv_heads)

    if out_strides == NO_STRIDES:
        return reduce

    def reduce_into(a: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
        sums = reduce(a, b)
        return tuple(  # type: ignore[return-value]
            s if s is None or strides is None else s.new_empty_strided(s.shape, strides).copy_(s)
            for s, strides in zip(sums, out_strides)
        )

    return reduce_into


def _no_copy(a: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
    raise AssertionError("the Python entry points copy nothing for this layout")


def _new_entry(
    op: str,
    a: Tensor,
    b: Tensor | None,
    num_kv_heads: int,
    num_heads: int,
    copies: bool,
    out_strides: tuple[Strides, Strides],
) -> _Entry:
    """Check one layout's arguments (raising what any call of the op raises) and pick its
    launch; ``copies`` False: the caller returns its input or a view, and only checks.
    ``out_strides``: a reduction's results' strides (None: contiguous)."""
    if op == "gqa_expand" and b is None:  # one tensor expanded: repeat_kv's call, in its words
        check_tensor("repeat_kv", "hidden_states", a)
    # One tensor: checked beside a zero-width partner, what the registered op would be given.
    check_inputs(op, transforms.NAMES[op], a, a.new_empty((*a.shape[:3], 0)) if b is None else b,
                 num_kv_heads, num_heads)  # fmt: skip
    n_rep = num_heads // num_kv_heads
    if not copies:
        backend()  # a bad NEURALOPS_GQA_BACKEND fails every call, these too
        return _Entry(_no_copy, num_kv_heads, num_heads)
    expanding = op == "gqa_expand"
    if use_triton(a):
        kernels = triton_kernels()
        run: Run = (kernels.expand_launch(a, b, n_rep) if expanding
                    else kernels.reduce_launch(a, b, n_rep, out_strides=out_strides))  # fmt: skip
    else:
        run = _reference_run(op, a, b, num_kv_heads, num_heads, out_strides)
    if not expanding:
        return _Entry(run, num_kv_heads, num_heads)
    return _Entry(
        run, num_kv_heads, num_heads, (gradient_strides(a), None if b is None else gradient_strides(b))
    )


_ENTRIES: dict[tuple[object, ...], _Entry] = {}
_backend_variable = private_internals.environment_reader(BACKEND_ENV)
_MAX_ENTRIES = 4096


def _entry(
    op: str,
    a: Tensor,
    b: Tensor | None,
    num_kv_heads: int,
    num_heads: int,
    copies: bool = True,
    out_strides: tuple[Strides, Strides] = NO_STRIDES,
) -> _Entry:
    """The entry of this call's layout, checked and made on its first call."""
    # The backend variable is part of the key: a new value takes effect on the next call.
    variable = _backend_variable()
    if b is None:
        key: tuple[object, ...] = (op, a.shape, a.stride(), a.dtype, a.get_device(), num_kv_heads, num_heads,
                                   variable, copies, out_strides)  # fmt: skip
    else:
        key = (op, a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(),
               num_kv_heads, num_heads, variable, copies, out_strides)  # fmt: skip
    entry = _ENTRIES.get(key)
    if entry is None:
        entry = _new_entry(op, a, b, num_kv_heads, num_heads, copies, out_strides)
        if len(_ENTRIES) >= _MAX_ENTRIES:
            _ENTRIES.clear()
        _ENTRIES[key] = entry
    return entry


# --- the guard: which calls are plain -----------------------------------------------------


def _plain_tensor(x: object) -> bool:
    """Whether ``x`` is a plain dense CPU or CUDA tensor: no subclass (nor the Python
    dispatch key one leaves behind), no conjugate, negative or zero-tensor bit, no
    functionalization or functorch wrapper, no sparse, nested or quantized layout.

    Read from the tensor's own attributes, which cost a cold host far less than a call into
    the dispatcher's bindings: the wrappers have no storage of their own, so their data
    pointer raises (``torch.func`` and legacy vmap) or is null (functionalization). A null
    pointer is also what an empty tensor has; there the dispatch keys decide
    (``_plain_keys``). A plain tensor with elements and a null pointer has had its storage
    freed: not plain, so the registered op's kernels refuse it by name."""
    if (
        type(x) is not Tensor
        or x.layout is not _STRIDED
        or not (x.is_cuda or x.is_cpu)
        or x.is_conj()
        or x.is_neg()
        or x._is_zerotensor()
        or x.is_nested
        or x.is_quantized
        or x._python_dispatch  # type: ignore[attr-defined]  # a dispatch subclass swapped to Tensor
    ):
        return False
    try:
        return bool(x.data_ptr()) or (x.numel() == 0 and _plain_keys(x))
    except RuntimeError:  # "Cannot access data pointer of Tensor that doesn't have storage"
        return False


_STRIDED = torch.strided
_PLAIN_KEYS: set[int] = set()
_LEARNT_DEVICES: set[str] = set()


def _plain_keys(x: Tensor) -> bool:
    """Whether ``x``'s dispatch keys are a plain dense CPU or CUDA tensor's, learnt from a
    fresh tensor of each device type (and an inference tensor) the first time one is met
    where a fresh tensor is plain: inside a ``torch.func`` transform or a mode it would be
    the transform's wrapper, so nothing is learnt there and ``x`` counts as not plain."""
    keys = _dispatch_keys(x).raw_repr()
    if keys in _PLAIN_KEYS:
        return True
    device = x.device
    if device.type not in ("cpu", "cuda") or device.type in _LEARNT_DEVICES or _watched():
        return False
    _LEARNT_DEVICES.add(device.type)
    with torch.inference_mode(False):  # a normal tensor, also where inference mode is on
        fresh = torch.empty(0, device=device)
    with torch.inference_mode():
        inference = torch.empty(0, device=device)
    for made in (fresh, inference):
        _PLAIN_KEYS.add(_dispatch_keys(made).raw_repr())
    return keys in _PLAIN_KEYS


if _internals is not None:
    _dispatch_keys = _internals.dispatch_keys
    _dispatch_modes, _transforms_active = _internals.dispatch_modes, _internals.transforms_active
    _function_modes, _forward_ad_level, _profiling = (
        _internals.function_modes,
        _internals.forward_ad_level,
        _internals.profiling,
    )


def _watched() -> bool:
    """Whether something must see the op as an op: a mode, a transform, forward AD, the profiler."""
    return bool(
        _dispatch_modes()
        or _transforms_active()
        or _function_modes()
        or _forward_ad_level() >= 0
        or _profiling()
    )


# --- autograd of the plain route ------------------------------------------------------------


def reduce_gradients(
    grad_a: Tensor | None,
    grad_b: Tensor | None,
    num_kv_heads: int,
    num_heads: int,
    out_strides: tuple[Strides, Strides] = NO_STRIDES,
) -> tuple[Tensor | None, Tensor | None]:
    """The expansion's backward: each wanted gradient summed over its group (None stays None).

    Plain gradients outside ``create_graph`` take the cached launch, into results with
    ``out_strides`` (the inputs' ``gradient_strides``); otherwise the registered
    ``gqa_reduce``, so a graph of the backward is recorded and modes see it, and its results
    are contiguous.
    """
    if grad_a is None and grad_b is None:
        return None, None
    if not torch.is_grad_enabled() and not _watched():
        first, second = (grad_b, None) if grad_a is None else (grad_a, grad_b)
        assert first is not None
        if _plain_tensor(first) and (second is None or _plain_tensor(second)):
            if grad_a is None:
                out_strides = (out_strides[1], None)
            elif grad_b is None:
                out_strides = (out_strides[0], None)
            out_first, out_second = _entry(
                "gqa_reduce", first, second, num_kv_heads, num_heads, out_strides=out_strides
            ).run(first, second)
            return (None, out_first) if grad_a is None else (out_first, out_second)
    a, b = transforms.pair_or_empty(grad_a, grad_b)
    out_a, out_b = torch.ops.neuralops.gqa_reduce(a, b, num_kv_heads, num_heads)
    return (None if grad_a is None else out_a), (None if grad_b is None else out_b)


def _expand_forward(ctx: Any, a: Tensor, b: Tensor | None, entry: _Entry) -> Tensor | Pair:
    ctx.entry = entry
    # An output nobody used arrives as None instead of a materialised zero tensor.
    ctx.set_materialize_grads(False)
    out_a, out_b = entry.run(a, b)
    if out_b is None:
        return out_a
    # Each output depends on one input only: it is differentiable only where that input is.
    for out, wanted in zip((out_a, out_b), ctx.needs_input_grad):
        if not wanted:
            ctx.mark_non_differentiable(out)
    return out_a, out_b


def _expand_backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, Tensor | None, None]:
    wanted = ctx.needs_input_grad
    grad_a = grads[0] if wanted[0] else None
    grad_b = grads[1] if len(grads) > 1 and wanted[1] else None
    entry = ctx.entry
    return (*reduce_gradients(grad_a, grad_b, entry.num_kv_heads, entry.num_heads, entry.grad_strides), None)


# ``apply(a, b or None, entry)``: the plain route's expansion with its backward. Built on
# the single-level Function base, whose ``apply`` is autograd's own (the public
# ``autograd.Function.apply`` adds a Python wrapper per call).
_ExpandFunction: Any = (
    None
    if _internals is None
    else type(
        "gqa_expand_eager",
        (_internals.single_level_function,),
        {"forward": staticmethod(_expand_forward), "backward": staticmethod(_expand_backward)},
    )
)


# --- the plain route's entry points ---------------------------------------------------------


def expand(k: object, v: object, num_kv_heads: object, num_heads: object, alias: bool = False) -> Pair | None:
    """``gqa_expand`` on the plain route, or None where the call must take the registered op.

    ``alias``: return the inputs themselves when there is nothing to expand (the Python
    entry points do, like Hugging Face's ``repeat_kv``; a registered op may not).
    """
    if (
        _internals is None
        or type(num_kv_heads) is not int
        or type(num_heads) is not int
        or not (_plain_tensor(k) and _plain_tensor(v))
        or _watched()
    ):
        return None
    assert isinstance(k, Tensor) and isinstance(v, Tensor)
    copies = not (alias and num_heads == num_kv_heads)
    entry = _entry("gqa_expand", k, v, num_kv_heads, num_heads, copies=copies)
    if not copies:
        return k, v
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        return _ExpandFunction.apply(k, v, entry)  # type: ignore[no-any-return]
    out_k, out_v = entry.run(k, v)
    return out_k, out_v  # type: ignore[return-value]


def repeat(x: object, n_rep: object) -> Tensor | None:
    """Hugging Face's ``repeat_kv(x, n_rep)`` on the plain route (one tensor launched), or None."""
    if _internals is None or type(n_rep) is not int or not _plain_tensor(x) or _watched():
        return None
    assert isinstance(x, Tensor)
    if n_rep < 1 or x.dim() != 4:
        return None  # the caller's own checks word the error
    kv_heads = x.shape[1]
    if not kv_heads:
        return None  # the caller returns the empty input, as Hugging Face's returns a view of it
    entry = _entry("gqa_expand", x, None, kv_heads, kv_heads * n_rep, copies=n_rep > 1 and kv_heads > 1)
    if n_rep == 1:
        return x
    if kv_heads == 1:
        # Hugging Face's result here: a broadcast view, which SDPA reads in place.
        return x.expand(x.shape[0], n_rep, x.shape[2], x.shape[3])
    if torch.is_grad_enabled() and x.requires_grad:
        return _ExpandFunction.apply(x, None, entry)  # type: ignore[no-any-return]
    return entry.run(x, None)[0]


# --- the registered op's eager kernels -------------------------------------------------------


def _refuse_tangents(op: str, a: Tensor, b: Tensor) -> None:
    """Without the op's own autograd kernel, a ``torch.autograd.forward_ad`` dual tensor gets
    an error, not zero tangents (outside a ``dual_level`` this reads nothing)."""
    if forward_ad.unpack_dual(a).tangent is not None or forward_ad.unpack_dual(b).tangent is not None:
        raise RuntimeError(
            f"{op}: forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) through this op "
            f"needs the op's own autograd kernel, which {ENV}=0 turns off"
        )


def _check_memory(op: str, a: Tensor, b: Tensor) -> None:
    names = transforms.NAMES[op]
    check_memory(op, names[0], a)
    check_memory(op, names[1], b)


def memory_freed(x: object) -> bool:
    """Whether ``x`` is a plain tensor whose storage was freed (elements, a null pointer); False
    without the private internals, which tell it from a functionalization wrapper."""
    if _internals is None or type(x) is not Tensor or not x.numel() or not _plain_keys(x):
        return False
    return not x.data_ptr()


def _device_kernel(op: str) -> Callable[[Tensor, Tensor, int, int], Pair]:
    def impl(a: Tensor, b: Tensor, num_kv_heads: int, num_heads: int) -> Pair:
        if type(a) is not Tensor or type(b) is not Tensor:  # None (the schema lets it through)
            check_inputs(op, transforms.NAMES[op], a, b, num_kv_heads, num_heads)
        if not ENABLED:
            _refuse_tangents(op, a, b)
        if not (a.data_ptr() and b.data_ptr()):  # empty, a zero-width partner, or freed memory
            _check_memory(op, a, b)
        out_a, out_b = _entry(op, a, b, num_kv_heads, num_heads).run(a, b)
        return out_a, out_b  # type: ignore[return-value]

    impl.__name__ = f"{op}_impl"
    return impl


expand_impl = _device_kernel("gqa_expand")
"""``gqa_expand``'s CPU and CUDA kernel: the cached launch, checked on a layout's first call."""
reduce_impl = _device_kernel("gqa_reduce")
"""``gqa_reduce``'s CPU and CUDA kernel."""


def _has_tangent(x: Tensor) -> bool:
    # Level 0 explicitly: PyTorch has one forward-AD level, and a jvp that torch.compile
    # traces enters it without setting forward_ad's Python-side record of it.
    try:
        return forward_ad.unpack_dual(x, level=0).tangent is not None
    except (NotImplementedError, RuntimeError):  # sparse, quantized...: no tangents; the op refuses them
        return False


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Pair) -> None:
    # The last input says which of k and v are differentiated (the kernel knows: forward-mode
    # tangents can't be read while apply() runs, it turns forward AD off).
    transforms.setup_context_for(ctx, inputs[:4], output, inputs[4][:2])


def autograd_kernel(name: str) -> Callable[..., Pair] | None:
    """Op ``name``'s autograd kernel (dispatch keyset first), or None where the internals are off.

    Plain tensors with no mode, transform or forward-AD level take the plain route (a
    ``gqa_reduce`` that needs a gradient excepted: a double backward, rare); everything
    else applies the op's ``autograd.Function``, or runs below autograd where nothing is
    differentiated.
    """
    internals = _internals
    if internals is None:
        return None
    op = transforms.op_named(name)
    impl = expand_impl if name == "gqa_expand" else reduce_impl
    below_autograd, set_fwd_grad_enabled = internals.below_autograd, internals.set_fwd_grad_enabled

    def forward(
        a: Tensor, b: Tensor, num_kv_heads: int, num_heads: int, route: tuple[bool, bool, bool]
    ) -> Pair:
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
    expanding = name == "gqa_expand"

    def kernel(
        keyset: torch._C.DispatchKeySet, a: Tensor | None, b: Tensor | None, num_kv_heads: int, num_heads: int
    ) -> Pair:
        if a is None or b is None:  # the schema lets None through; the implementation names it
            return impl(a, b, num_kv_heads, num_heads)  # type: ignore[arg-type]
        if transforms_active():
            # Inside a torch.func transform both count as differentiated: a level's tensors
            # don't show whether they carry its tangent, and an unused derivative costs nothing.
            with allow_single_level():
                return function.apply(a, b, num_kv_heads, num_heads, (True, True, False))  # type: ignore[no-any-return]
        plain_keys = keyset.raw_repr() in plain
        direct = plain_keys and dispatch_modes() == 0
        grad = torch.is_grad_enabled()
        if direct and forward_ad_level() < 0:
            differentiated = grad and (a.requires_grad or b.requires_grad)
            if expanding and differentiated:
                if not (a.data_ptr() and b.data_ptr()):
                    _check_memory(name, a, b)
                return _ExpandFunction.apply(a, b, _entry(name, a, b, num_kv_heads, num_heads))  # type: ignore[no-any-return]
            if not differentiated:
                return impl(a, b, num_kv_heads, num_heads)
        tangents = forward_ad_level() >= 0 or not plain_keys
        differentiated_a = (grad and a.requires_grad) or (tangents and _has_tangent(a))
        differentiated_b = (grad and b.requires_grad) or (tangents and _has_tangent(b))
        if differentiated_a or differentiated_b:
            route = (differentiated_a, differentiated_b, direct)
            return function.apply(a, b, num_kv_heads, num_heads, route)  # type: ignore[no-any-return]
        if direct:
            return impl(a, b, num_kv_heads, num_heads)
        with below_autograd():  # wrapped tensors, dispatch modes: every other key still runs
            return op(a, b, num_kv_heads, num_heads)

    return kernel

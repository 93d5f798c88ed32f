"""Every private PyTorch and Triton internal the package uses, each behind a probe.

They buy speed on an eager call's host path, nothing else; public APIs do the same work
more slowly:

- **Triton's compiled-kernel launcher** (``CompiledKernel.run``, ``.function``,
  ``.packed_metadata``, ``JITFunction.arg_names``, ``triton.knobs.runtime`` launch hooks) and
  ``torch._C._cuda_getCurrentRawStream``: after a plan's first launch, later launches call
  the compiled handle directly instead of ``kernel[grid](...)``, whose per-call argument
  binding is most of a small call's host time. Probed once per process by launching a tiny
  kernel through the handle and reading its result back.
- **The op's autograd kernel** (``torch._library.autograd.make_autograd_impl``,
  ``CustomOpDef._opoverload``, ``torch._C.DispatchKeySet``, ``torch._C._len_torch_dispatch_stack``,
  ``torch.autograd.forward_ad._current_level``): plain CPU/CUDA tensors that need no gradient
  skip custom_op's Python autograd wrapper, and forward-mode tangents are computed (custom
  ops drop them otherwise). The fast path is an allow-list: only a call whose dispatch keys
  are exactly a backend and its autograd key takes it; anything else (a key a later torch
  adds included) goes down custom_op's own path.

``NEURALOPS_GQA_PRIVATE_INTERNALS=0`` (read at import) turns all of them off, leaving public
APIs only: ``kernel[grid](...)`` launches and custom_op's own autograd. A probe that fails
turns its own fast path off with one warning; importing never fails because an internal
moved. With them off, forward-mode AD through the ops is not computed: a dual tensor of
``torch.autograd.forward_ad`` is refused with an error (``neuralops_gqa.ops`` checks with the
public ``forward_ad.unpack_dual``), but ``torch.func.jvp``/``jacfwd`` hand the ops unwrapped
tensors that no public API can tell apart, and get PyTorch's custom-op behaviour: zero
tangents (docs/usage/limitations.md).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

ENV = "NEURALOPS_GQA_PRIVATE_INTERNALS"
ENABLED = os.environ.get(ENV, "1").strip().lower() not in {"0", "false", "off", "no"}
"""Whether the private fast paths may be used at all (``NEURALOPS_GQA_PRIVATE_INTERNALS``)."""


_warned: set[str] = set()


def _disable(what: str, error: BaseException) -> None:
    """Warn, once per fast path, that ``what`` is off."""
    if what in _warned:
        return
    _warned.add(what)
    warnings.warn(
        f"neuralops_gqa: {what} is unavailable in this torch/triton ({type(error).__name__}: {error}); "
        f"using the public path instead (slower host path, same results). Set {ENV}=0 to silence this.",
        RuntimeWarning,
        stacklevel=3,
    )


# --- Triton: launching a compiled kernel's handle directly -----------------------------

_launch_probe_result: bool | None = None


def _launch_hooks_set() -> bool:
    """Whether a profiler asked Triton for launch hooks (launches then keep Triton's own path)."""
    import triton

    runtime = triton.knobs.runtime
    for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook):
        # Triton >= 3.4 keeps an always-present chain of hooks; older ones a callable or None.
        calls = getattr(hook, "calls", None)
        if bool(calls) if calls is not None else hook is not None:
            return True
    return False


def _handle_launcher(
    kernel: Any, compiled: Any, meta: dict[str, object], n_runtime: int
) -> Callable[..., None]:
    handle, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    # Triton's compiled handle takes every kernel parameter in declaration order: the
    # runtime ones, then the constexprs.
    constexprs = [meta[name] for name in kernel.arg_names[n_runtime:]]
    current_stream = torch._C._cuda_getCurrentRawStream

    def launch(grid0: int, index: int, tensors: tuple[Any, ...], args: tuple[int, ...]) -> None:
        handle(grid0, 1, 1, current_stream(index), function, metadata, None, None, None,
               *tensors, *args, *constexprs)  # fmt: skip

    return launch


def _probe_launch(probe_kernel: Any, index: int) -> bool:
    """Launch ``probe_kernel(out, value)`` through the handle and check that it stored ``value``."""
    out = torch.zeros(1, dtype=torch.int32, device=f"cuda:{index}")
    with torch.cuda.device(index):
        compiled = probe_kernel[(1,)](out, 7)
        torch.cuda.synchronize(index)
        launch = _handle_launcher(probe_kernel, compiled, {}, 2)
        launch(1, index, (out,), (42,))
        torch.cuda.synchronize(index)
    _launch_hooks_set()
    torch._C._cuda_getDevice()
    return int(out.item()) == 42


def direct_launcher(
    kernel: Any, compiled: Any, meta: dict[str, object], n_runtime: int, index: int, probe_kernel: Any
) -> Callable[[int, tuple[Any, ...], tuple[int, ...]], bool] | None:
    """A function ``launch(grid0, tensors, args) -> bool`` that launches ``compiled`` (what
    ``kernel[grid](...)`` returned) on device ``index``'s current stream, or None where the
    fast path is off or not usable. ``launch`` returns False, launching nothing, when the
    caller must take Triton's own path (launch hooks set, another current device)."""
    global _launch_probe_result
    if not ENABLED or compiled is None:
        return None
    if _launch_probe_result is None:
        try:
            _launch_probe_result = _probe_launch(probe_kernel, index)
            if not _launch_probe_result:
                raise RuntimeError("a probe kernel launched through the handle stored the wrong value")
        except Exception as e:  # any failure means: don't use it
            _launch_probe_result = False
            _disable("launching Triton's compiled kernel handle directly", e)
    if not _launch_probe_result:
        return None
    try:
        run = _handle_launcher(kernel, compiled, meta, n_runtime)
    except (AttributeError, KeyError) as e:
        _launch_probe_result = False
        _disable("launching Triton's compiled kernel handle directly", e)
        return None
    get_device = torch._C._cuda_getDevice

    def launch(grid0: int, tensors: tuple[Any, ...], args: tuple[int, ...]) -> bool:
        if index != get_device() or _launch_hooks_set():
            return False
        run(grid0, index, tensors, args)
        return True

    return launch


# --- torch: the op's autograd kernel ---------------------------------------------------

Impl = Callable[[torch.Tensor, torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]]


def _plain_keysets() -> frozenset[int]:
    """Raw dispatch keysets of a plain dense CPU or CUDA tensor at its autograd kernel."""
    key, keyset = torch._C.DispatchKey, torch._C.DispatchKeySet
    return frozenset(
        (keyset(getattr(key, backend)) | keyset(getattr(key, "Autograd" + backend))).raw_repr()
        for backend in ("CPU", "CUDA")
    )


def _forward_ad_level() -> int:
    from torch.autograd import forward_ad

    level: int = forward_ad._current_level
    return level


def autograd_kernel(impl: Impl, custom_op: Any) -> Callable[..., tuple[torch.Tensor, ...]] | None:
    """The op's autograd kernel (dispatch key first), or None where the fast path is off.

    Plain tensors that need no gradient go straight to ``impl``; inputs with forward-mode
    tangents get theirs from the op itself (both ops are linear, so the tangent of an output
    is the op applied to the tangents); everything else goes to custom_op's own kernel,
    built from the same registration, which redispatches through every other key.
    """
    if not ENABLED:
        return None
    try:
        from torch._library.autograd import make_autograd_impl

        slow: Callable[..., tuple[torch.Tensor, ...]] = make_autograd_impl(custom_op._opoverload, custom_op)
        plain = _plain_keysets()
        dispatch_stack_len = torch._C._len_torch_dispatch_stack
        if dispatch_stack_len() != 0 or _forward_ad_level() != -1:
            raise RuntimeError("the dispatch-mode stack or the forward-AD level reads wrong at import")
    except Exception as e:
        _disable("the op's eager autograd fast path", e)
        return None
    from torch.autograd import forward_ad

    def with_tangents(
        keyset: torch._C.DispatchKeySet, a: torch.Tensor, b: torch.Tensor, num_kv_heads: int, num_heads: int
    ) -> tuple[torch.Tensor, ...] | None:
        # Level 0 explicitly: PyTorch has one forward-AD level, and a jvp that torch.compile
        # traces enters it without setting forward_ad's Python-side record of it.
        try:
            (pa, ta), (pb, tb) = forward_ad.unpack_dual(a, level=0), forward_ad.unpack_dual(b, level=0)
        except (NotImplementedError, RuntimeError):  # sparse, quantized...: no tangents; the op refuses them
            return None
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
        # Only floating outputs carry tangents (an integer k beside a differentiated v).
        return tuple(
            forward_ad.make_dual(o, t, level=0) if o.is_floating_point() else o for o, t in zip(out, tangents)
        )

    def kernel(
        keyset: torch._C.DispatchKeySet,
        a: torch.Tensor | None,
        b: torch.Tensor | None,
        num_kv_heads: int,
        num_heads: int,
    ) -> tuple[torch.Tensor, ...]:
        if a is None or b is None:  # the schema lets None through; the implementation names it
            return impl(a, b, num_kv_heads, num_heads)  # type: ignore[arg-type]
        plain_keys = keyset.raw_repr() in plain
        if forward_ad._current_level >= 0 or not plain_keys:
            out = with_tangents(keyset, a, b, num_kv_heads, num_heads)
            if out is not None:
                return out
        elif (
            not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))
            and dispatch_stack_len() == 0
        ):
            return impl(a, b, num_kv_heads, num_heads)
        return slow(keyset, a, b, num_kv_heads, num_heads)

    return kernel


# --- torch: a clear error for jagged nested tensors ------------------------------------


def jagged_tensor_class() -> type | None:
    """The class of ``torch.nested`` jagged tensors (``torch.nested._internal``), or None.

    Used to register a rule that refuses them with a message; without it they raise
    PyTorch's bare ``NotImplementedError`` naming the op.
    """
    if not ENABLED:
        return None
    try:
        from torch.nested._internal.nested_tensor import NestedTensor

        if not issubclass(NestedTensor, torch.Tensor):
            raise TypeError("NestedTensor is no longer a Tensor subclass")
    except Exception as e:
        _disable("a clear error for jagged nested tensors", e)
        return None
    return NestedTensor

"""Every private PyTorch and Triton internal the package uses, each behind a probe.

This module knows nothing of the ops: it hands out probed primitives, and the package that
registers the ops (``neuralops_gqa``) builds on them. What they buy:

- **Triton's compiled-kernel launcher** (``CompiledKernel.run``, ``.function``,
  ``.packed_metadata``, ``JITFunction.arg_names``, ``triton.knobs.runtime`` launch hooks) and
  ``torch._C._cuda_getCurrentRawStream``: after a plan's first launch, later launches call
  the compiled handle directly instead of ``kernel[grid](...)``, whose per-call argument
  binding is most of a small call's host time. Probed once per process by launching a tiny
  kernel through the handle and reading its result back.
- **What an autograd kernel of the ops needs** (``AutogradInternals``): a call below the
  autograd keys, ``torch.func``'s single-level ``autograd.Function``, the forward-AD and
  functorch state, the dispatch keysets of plain tensors. With them the ops' own autograd
  kernel sends plain tensors that need no gradient straight to the implementation (custom
  ops' Python autograd wrapper is most of a small eager call), computes forward-mode
  tangents (custom ops drop them), and works under every ``torch.func`` transform (custom
  ops' generated ``autograd.Function`` fails under ``grad``, ``vjp``, ``jacrev``, ``hessian``).
- **AOTAutograd's table of the Triton kernels each op launches**
  (``torch._library.triton.triton_ops_to_kernels``), which keys its cache of compiled graphs.
- **The jagged nested tensor class**, so those get a clear error.

``NEURALOPS_GQA_PRIVATE_INTERNALS=0`` (read at import) turns all of them off, leaving public
APIs only: ``kernel[grid](...)`` launches and custom_op's own autograd, with the limits
docs/usage/limitations.md lists. A probe that fails turns its own part off with one
warning; importing never fails because an internal moved.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

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
    return bool(runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls)


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


# --- torch: what the ops' autograd kernel needs of the dispatcher and of torch.func -------


class AutogradInternals(NamedTuple):
    """The private pieces an autograd kernel needs that no public API offers.

    - ``below_autograd``: a context in which a call skips the autograd keys (what every
      built-in autograd kernel does before it calls the implementation).
    - ``single_level_function``: the ``autograd.Function`` base that works inside one level
      of ``torch.func``'s transforms, the way built-in autograd kernels do; applied inside
      ``allow_single_level()``.
    - ``transforms_active()``, ``fwd_grad_enabled()``, ``set_fwd_grad_enabled(mode)``,
      ``dispatch_modes()`` (the number of active ``TorchDispatchMode``s) and
      ``forward_ad_level()`` (the innermost ``torch.autograd.forward_ad`` level, -1 for none).
    - ``plain_keysets``: the dispatch keysets of a plain dense CPU or CUDA tensor at its
      autograd kernel.
    """

    below_autograd: Callable[[], Any]
    single_level_function: type
    allow_single_level: Callable[[], Any]
    transforms_active: Callable[[], bool]
    fwd_grad_enabled: Callable[[], bool]
    set_fwd_grad_enabled: Callable[[bool], Any]
    dispatch_modes: Callable[[], int]
    forward_ad_level: Callable[[], int]
    plain_keysets: frozenset[int]


def _plain_keysets() -> frozenset[int]:
    key, keyset = torch._C.DispatchKey, torch._C.DispatchKeySet
    return frozenset(
        (keyset(getattr(key, backend)) | keyset(getattr(key, "Autograd" + backend))).raw_repr()
        for backend in ("CPU", "CUDA")
    )


def _probe_autograd() -> AutogradInternals:
    from torch._functorch.utils import enable_single_level_autograd_function
    from torch.autograd import forward_ad
    from torch.autograd.function import _SingleLevelFunction

    found = AutogradInternals(
        below_autograd=torch._C._AutoDispatchBelowAutograd,
        single_level_function=_SingleLevelFunction,
        allow_single_level=enable_single_level_autograd_function,
        transforms_active=torch._C._are_functorch_transforms_active,
        fwd_grad_enabled=torch._C._is_fwd_grad_enabled,
        set_fwd_grad_enabled=forward_ad._set_fwd_grad_enabled,
        dispatch_modes=torch._C._len_torch_dispatch_stack,
        forward_ad_level=lambda: forward_ad._current_level,
        plain_keysets=_plain_keysets(),
    )
    # Each as it is used: outside any transform, mode or dual level, and usable as contexts.
    if not issubclass(torch.autograd.Function, found.single_level_function):
        raise TypeError("_SingleLevelFunction is no longer the base of autograd.Function")
    with found.below_autograd(), found.allow_single_level(), found.set_fwd_grad_enabled(True):
        pass
    if (found.transforms_active(), found.dispatch_modes(), found.forward_ad_level()) != (False, 0, -1):
        raise RuntimeError("the functorch, dispatch-mode or forward-AD state reads wrong at import")
    if not found.fwd_grad_enabled() or len(found.plain_keysets) != 2:
        raise RuntimeError("forward-AD mode or the dispatch keysets read wrong at import")
    return found


_autograd: AutogradInternals | None = None
_autograd_probed = False


def autograd_internals() -> AutogradInternals | None:
    """The probed ``AutogradInternals``, or None where the switch or a failed probe turns them off."""
    global _autograd, _autograd_probed
    if not _autograd_probed:
        _autograd_probed = True
        if ENABLED:
            try:
                _autograd = _probe_autograd()
            except Exception as e:  # any failure means: don't use them
                _disable("the op's own autograd kernel (eager fast path, torch.func transforms)", e)
    return _autograd


def symbolic_example_value(size: torch.SymInt) -> int | None:
    """The value a symbolic size had in the example a trace started from (no guard added),
    or None: messages then show the symbol. Not behind the switch: it only words errors."""
    hint = getattr(getattr(size, "node", None), "hint", None)
    return hint if isinstance(hint, int) else None


# --- torch: what torch.library.triton_op does, without importing Inductor and Triton -------


def compiler_decomposition(body: Callable[..., Any]) -> tuple[type, Callable[..., Any]] | None:
    """``(FunctionalTensorMode, rule)``: a torch_dispatch rule that replaces an op by ``body``
    when AOTDispatcher functionalizes a graph for a compiler, and keeps the op whole under
    ``torch.export`` (the rule ``torch.library.triton_op`` registers). None where unavailable;
    the caller then defines the op with ``triton_op`` itself, whose definition scans the body's
    source for Triton kernels, importing Inductor and Triton (about a second per import).
    """
    if not ENABLED:
        return None
    try:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

        def export_keeps_it_whole() -> bool:
            from torch.export._trace import custom_triton_ops_decomposition_disabled

            return bool(custom_triton_ops_decomposition_disabled())  # type: ignore[no-untyped-call]

        if not (
            hasattr(FunctionalTensorMode, "__torch_dispatch__") and issubclass(FunctionalTensor, torch.Tensor)
        ):
            raise TypeError("FunctionalTensorMode or FunctionalTensor changed shape")
    except Exception as e:
        _disable("defining the ops without importing Inductor", e)
        return None

    def rule(mode: Any, op: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if export_keeps_it_whole():
            return mode.__torch_dispatch__(op, types, args, kwargs)
        # Any other tensor subclass (DTensor, ...) is left to its own rule.
        if any(t not in (torch.Tensor, FunctionalTensor) and not issubclass(t, FakeTensor) for t in types):
            return NotImplemented
        with mode:
            return body(*args, **kwargs)

    return FunctionalTensorMode, rule


def record_triton_kernels(op_names: tuple[str, ...], kernels: list[Any]) -> None:
    """Tell AOTAutograd's cache which Triton kernels the ops' compiled graphs launch now
    (what ``torch.library.triton_op`` records when it defines an op), so a cached graph is
    keyed on their source: a changed kernel, or a backend switched between runs (an empty
    list: the reference), is a cache miss, not another run's compiled code."""
    if not ENABLED:
        return
    try:
        from torch._library import triton as library_triton

        for name in op_names:
            library_triton.triton_ops_to_kernels[name] = kernels
    except Exception as e:
        _disable("keying the cache of compiled graphs on the kernels' source", e)


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

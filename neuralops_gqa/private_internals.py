"""The private PyTorch (and one Python) internals the ops' registration uses, each behind a probe.

What they buy:

- **What an autograd kernel of the ops needs** (``AutogradInternals``): a call below the
  autograd keys, ``torch.func``'s single-level ``autograd.Function``, the forward-AD and
  functorch state, the dispatch keysets of plain tensors. With them the ops' own autograd
  kernel sends plain tensors that need no gradient straight to the implementation (custom
  ops' Python autograd wrapper is most of a small eager call), computes forward-mode
  tangents (custom ops drop them), and works under every ``torch.func`` transform (custom
  ops' generated ``autograd.Function`` fails under ``grad``, ``vjp``, ``jacrev``, ``hessian``).
- **What ``torch.library.triton_op`` registers, without importing Inductor and Triton**: the
  rule that hands compilers the op's traced body, and AOTAutograd's table of the Triton
  kernels each op launches (``torch._library.triton.triton_ops_to_kernels``), which keys its
  cache of compiled graphs.
- **The jagged nested tensor class**, so those get a clear error.
- **Python's own table of the environment** (``os.environ._data``): the eager path reads
  ``NEURALOPS_GQA_BACKEND`` on every call, and a dict lookup costs a tenth of
  ``os.environ.get`` of an unset name.

The kernels' own internals (Triton's compiled-kernel launcher) are in
``csrc_free_ops/private_internals.py``, with the switch both modules obey:
``NEURALOPS_GQA_PRIVATE_INTERNALS=0`` turns every one of them off. A probe that fails turns
its own part off with one warning; importing never fails because an internal moved.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from csrc_free_ops.private_internals import ENABLED, disable

__all__ = [
    "AutogradInternals",
    "autograd_internals",
    "compiler_decomposition",
    "environment_reader",
    "jagged_tensor_class",
    "record_triton_kernels",
    "symbolic_example_value",
]


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
    - ``dispatch_keys(x)``: a tensor's own dispatch keyset (subclasses, layouts, the
      conjugate, negative and zero-tensor bits, functionalization and functorch wrappers
      show in it); ``function_modes()``: whether a ``TorchFunctionMode`` is active;
      ``profiling()``: whether the autograd profiler records. What the eager route's guard
      reads (``neuralops_gqa.eager``).
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
    dispatch_keys: Callable[[torch.Tensor], torch._C.DispatchKeySet]
    function_modes: Callable[[], bool]
    profiling: Callable[[], bool]


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
        dispatch_keys=torch._C._dispatch_keys,
        function_modes=torch._C._is_torch_function_mode_enabled,
        profiling=torch._C._autograd._profiler_enabled,
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
    plain, negative = torch.empty(1), torch.empty(1)._neg_view()
    if found.dispatch_keys(plain).raw_repr() == found.dispatch_keys(negative).raw_repr():
        raise RuntimeError("a tensor's dispatch keys don't show its negative bit")
    # The private tensor attributes the eager guard reads besides the public ones.
    if plain._is_zerotensor() or plain._python_dispatch or not negative.is_neg():  # type: ignore[attr-defined]
        raise RuntimeError("a tensor's zero-tensor, Python-dispatch or negative bit reads wrong")
    if found.function_modes() or found.profiling():
        raise RuntimeError("the torch-function mode or profiler state reads wrong at import")
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
                disable("the op's own autograd kernel (eager fast path, torch.func transforms)", e)
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
        disable("defining the ops without importing Inductor", e)
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
        disable("keying the cache of compiled graphs on the kernels' source", e)


# --- Python: reading an environment variable on every call ----------------------------


def environment_reader(name: str) -> Callable[[], object]:
    """A function of no arguments whose result changes exactly when ``os.environ[name]`` does
    (None while unset): what identifies the variable's value, for a cache key read on every
    call. It looks the name up in ``os.environ``'s own table (``os.environ._data``, keyed and
    valued as the platform encodes them), one dict lookup, where ``os.environ.get`` of an
    unset name raises and catches a ``KeyError`` (about 0.6 us a read). Where the switch or
    the probe says no: ``os.environ.get``."""
    public: Callable[[], object] = functools.partial(os.environ.get, name)
    if not ENABLED:
        return public
    try:
        table, encode = os.environ._data, os.environ.encodekey  # type: ignore[attr-defined]
        if type(table) is not dict:
            raise TypeError("os.environ's table is no longer a dict")
        reader: Callable[[], object] = functools.partial(table.get, encode(name))
        probe = f"NEURALOPS_GQA_ENVIRONMENT_PROBE_{os.getpid()}"
        os.environ[probe] = "1"
        try:
            set_seen = table.get(encode(probe)) is not None
        finally:
            del os.environ[probe]
        if not set_seen or table.get(encode(probe)) is not None or (reader() is None) != (public() is None):
            raise RuntimeError("os.environ's table does not follow os.environ")
    except Exception as e:  # any failure means: don't use it
        disable(f"reading {name} from os.environ's own table", e)
        return public
    return reader


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
        disable("a clear error for jagged nested tensors", e)
        return None
    return NestedTensor

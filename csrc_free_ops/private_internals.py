"""The private Triton and PyTorch internals the kernels' launchers use, behind a probe,
and the switch that turns every private internal of the project off.

- **Triton's compiled-kernel launcher** (``CompiledKernel.run``, ``.function``,
  ``.packed_metadata``, ``JITFunction.arg_names``, ``triton.knobs.runtime`` launch hooks) and
  ``torch._C._cuda_getCurrentRawStream``: after a plan's first launch, later launches call
  the compiled handle directly instead of ``kernel[grid](...)``, whose per-call argument
  binding is most of a small call's host time. Probed once per process by launching a tiny
  kernel through the handle and reading its result back.

The internals the ops' registration uses (the dispatcher, ``torch.func``, the compilers'
tables) are the op package's, in ``neuralops_gqa/private_internals.py``; this package knows
nothing of operators. ``NEURALOPS_GQA_PRIVATE_INTERNALS=0`` (read at import) turns both
modules' internals off, leaving public APIs only: ``kernel[grid](...)`` launches and
custom_op's own autograd, with the limits docs/usage/limitations.md lists. A probe that
fails turns its own part off with one warning (``disable``); importing never fails because
an internal moved.
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


def disable(what: str, error: BaseException) -> None:
    """Warn, once per fast path, that ``what`` is off because ``error`` met its probe."""
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
            disable("launching Triton's compiled kernel handle directly", e)
    if not _launch_probe_result:
        return None
    try:
        run = _handle_launcher(kernel, compiled, meta, n_runtime)
    except (AttributeError, KeyError) as e:
        _launch_probe_result = False
        disable("launching Triton's compiled kernel handle directly", e)
        return None
    get_device = torch._C._cuda_getDevice

    def launch(grid0: int, tensors: tuple[Any, ...], args: tuple[int, ...]) -> bool:
        if index != get_device() or _launch_hooks_set():
            return False
        run(grid0, index, tensors, args)
        return True

    return launch

"""The private Triton and PyTorch internals the kernels' launchers use, behind a probe,
and the switch that turns every private internal of the project off.

- **Triton's compiled-kernel launcher** (``CompiledKernel.run``, ``.function``,
  ``.packed_metadata``, ``JITFunction.arg_names``, ``triton.knobs.runtime`` launch hooks) and
  ``torch._C._cuda_getCurrentRawStream``: after a plan's first launch, later launches call
  the compiled handle directly instead of ``kernel[grid](...)``, whose per-call argument
  binding is most of a small call's host time; where the handle is Triton's per-signature
  launcher (``.launch``, ``.launch_cooperative_grid``, ``.launch_pdl``, its scratch sizes),
  the C function under it, without the handle's Python frame. Probed once per process by
  launching a tiny kernel the same way and reading its result back.

The internals the ops' registration uses (the dispatcher, ``torch.func``, the compilers'
tables) are the op package's, in ``neuralops_gqa/private_internals.py``; this package knows
nothing of operators. ``NEURALOPS_GQA_PRIVATE_INTERNALS=0`` (read at import) turns both
modules' internals off, leaving public APIs only: ``kernel[grid](...)`` launches and
custom_op's own autograd, with the limits docs/usage/limitations.md lists. A probe that
fails turns its own part off with one warning (``disable``); importing never fails because
an internal moved.
"""

from __future__ import annotations

import inspect
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


def _per_kernel_launch(run: Any) -> Callable[..., Any] | None:
    """The C function under Triton's launcher object ``run``, where it is the per-signature
    kind built for each kernel (its ``__call__(gridX, gridY, gridZ, stream, function, *args)``
    only adds the scratch buffers, and this kernel needs none): calling it directly saves
    that Python frame. None for any other launcher (then the object itself is called)."""
    params = list(inspect.signature(type(run).__call__).parameters)
    if params != ["self", "gridX", "gridY", "gridZ", "stream", "function", "args"]:
        return None
    if run.global_scratch_size or run.profile_scratch_size:
        return None
    launch: Callable[..., Any] = run.launch
    return launch


def _handle_launcher(
    kernel: Any, compiled: Any, meta: dict[str, object], grid0: int, args: tuple[int, ...], index: int
) -> Callable[..., bool]:
    """``launch(*pointers) -> bool``: one launch of ``compiled`` with ``args`` on device
    ``index``'s current stream (one Python frame per launch: this is the hot path)."""
    import triton

    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    # Triton's compiled handle takes every kernel parameter in declaration order: the
    # pointers and the other runtime ones, then the constexprs (the kernels declare theirs last).
    tail = (*args, *(meta[name] for name in kernel.arg_names if name in meta))
    current_stream, get_device = torch._C._cuda_getCurrentRawStream, torch._C._cuda_getDevice
    runtime = triton.knobs.runtime
    c_launch = _per_kernel_launch(run)
    if c_launch is not None:
        # The per-kernel C launcher's own arguments: cooperative grid, PDL, no scratch buffers.
        head = (run.launch_cooperative_grid, run.launch_pdl, None, None, metadata, None, None, None)

        def launch(*pointers: int) -> bool:
            if index != get_device() or runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls:
                return False
            c_launch(grid0, 1, 1, current_stream(index), function, *head, *pointers, *tail)
            return True

        return launch

    def launch_through_handle(*pointers: int) -> bool:
        if index != get_device() or runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls:
            return False
        run(grid0, 1, 1, current_stream(index), function, metadata, None, None, None, *pointers, *tail)
        return True

    return launch_through_handle


def _probe_launch(probe_kernel: Any, index: int) -> bool:
    """Launch ``probe_kernel(out, value)`` through the handle and check that it stored ``value``."""
    out = torch.zeros(1, dtype=torch.int32, device=f"cuda:{index}")
    with torch.cuda.device(index):
        compiled = probe_kernel[(1,)](out, 7)
        torch.cuda.synchronize(index)
        launched = _handle_launcher(probe_kernel, compiled, {}, 1, (42,), index)(out.data_ptr())
        torch.cuda.synchronize(index)
    _launch_hooks_set()
    return launched and int(out.item()) == 42


def direct_launcher(
    kernel: Any, compiled: Any, meta: dict[str, object], grid0: int, args: tuple[int, ...], index: int,
    probe_kernel: Any,
) -> Callable[..., bool] | None:  # fmt: skip
    """A function ``launch(*pointers) -> bool`` that launches ``compiled`` (what
    ``kernel[grid](...)`` returned) over ``grid0`` programs with the scalar ``args`` on
    device ``index``'s current stream, or None where the fast path is off or not usable.
    ``pointers`` are the tensors' addresses as ints (Triton's launcher then skips its
    per-pointer driver query). ``launch`` returns False, launching nothing, when the caller
    must take Triton's own path (launch hooks set, another current device)."""
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
        return _handle_launcher(kernel, compiled, meta, grid0, args, index)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        _launch_probe_result = False
        disable("launching Triton's compiled kernel handle directly", e)
        return None

"""What an eager call costs the host, on the small shape where the GPU's work is shorter:
per call, calls queued back to back, candidates taking turns in rounds (median round).

Ours through every door a user takes (the Python entry, the registered ops with and without
inputs that need gradients, ``repeat_kv`` on k then v, the reduction, an expansion's
backward), Hugging Face's ``repeat_kv`` the same ways, compiled (default mode) and CUDA-graph
replays of both, and the floors under them: allocations, an ATen op, empty registered ops,
the expansion kernel's cached launch alone (CUDA). A backward costs its forward + backward
minus its forward (the report subtracts).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict

import torch
from torch import Tensor

import neuralops_gqa
from benchmarks import peers, timing
from benchmarks.cases import Shape
from benchmarks.results import Report, Step
from csrc_free_ops import gqa_triton

Pair = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


@functools.cache
def empty_ops() -> tuple[Callable[[Tensor], None], Callable[[Tensor], None], torch.library.Library]:
    """Two ops that do nothing, from ``torch.library.custom_op`` and from ``define``/``impl``
    (defined on first use, not at import; the library keeps the second registered)."""

    @torch.library.custom_op("neuralops_bench::empty_custom_op", mutates_args=())
    def empty_custom_op(x: Tensor) -> None:
        return None

    library = torch.library.Library("neuralops_bench", "FRAGMENT")
    library.define("empty_defined(Tensor x) -> ()")
    library.impl("empty_defined", lambda x: None, "CompositeExplicitAutograd")
    return empty_custom_op, torch.ops.neuralops_bench.empty_defined, library


def candidates(
    shape: Shape, dtype: torch.dtype, device: str, backend: str
) -> dict[str, tuple[str, Callable[[], object]]]:
    """name -> (what a reader calls it, the call)."""
    (k, v), (kg, vg) = shape.tensors(dtype, device), shape.tensors(dtype, device, requires_grad=True)
    gk, gv = shape.tensors(dtype, device, heads=shape.heads)
    kv, h, n = shape.kv_heads, shape.heads, shape.n_rep
    custom_op, defined, _ = empty_ops()
    ours: Pair = functools.partial(neuralops_gqa.gqa_expand, num_kv_heads=kv, num_heads=h)
    theirs: Pair = functools.partial(peers.hf, n_rep=n)

    def repeat_pair(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return neuralops_gqa.repeat_kv(a, n), neuralops_gqa.repeat_kv(b, n)

    def backward(expand: Pair) -> Callable[[], object]:
        return lambda: torch.autograd.grad(expand(kg, vg), (kg, vg), (gk, gv))

    found: dict[str, tuple[str, Callable[[], object]]] = {
        "expand": (f"`neuralops_gqa.gqa_expand(k, v, {kv}, {h})`", lambda: ours(k, v)),
        "expand_grad": ("the same, inputs that need gradients", lambda: ours(kg, vg)),
        "expand_fwd_bwd": ("the same, forward + backward (`torch.autograd.grad`)", backward(ours)),
        "op_expand": (f"`torch.ops.neuralops.gqa_expand(k, v, {kv}, {h})`", lambda: peers.EXPAND(k, v, kv, h)),
        "op_expand_grad": ("the same, inputs that need gradients", lambda: peers.EXPAND(kg, vg, kv, h)),
        "op_reduce": (f"`torch.ops.neuralops.gqa_reduce(gk, gv, {kv}, {h})`", lambda: peers.REDUCE(gk, gv, kv, h)),
        "repeat_kv_pair": (f"`neuralops_gqa.repeat_kv(k, {n})`, then v", lambda: repeat_pair(k, v)),
        "repeat_kv_pair_grad": ("the same, inputs that need gradients", lambda: repeat_pair(kg, vg)),
        "repeat_kv_pair_fwd_bwd": ("the same, forward + backward (`torch.autograd.grad`)", backward(repeat_pair)),
        "hf": ("Hugging Face's `repeat_kv` on k and v", lambda: theirs(k, v)),
        "hf_grad": ("the same, inputs that need gradients", lambda: theirs(kg, vg)),
        "hf_fwd_bwd": ("the same, forward + backward (`torch.autograd.grad`)", backward(theirs)),
        "floor_empty_like": ("floor: two `torch.empty_like`", lambda: (torch.empty_like(k), torch.empty_like(v))),
        "floor_add": ("floor: `torch.add(k, v)`", lambda: torch.add(k, v)),
        "floor_custom_op": ("floor: an empty `torch.library.custom_op`", lambda: custom_op(k)),
        "floor_define_impl": ("floor: an empty `torch.library.define`/`impl` op", lambda: defined(k)),
    }  # fmt: skip
    if device == "cuda" or backend != "inductor":  # Inductor on a CPU needs a C++ compiler: not a given
        expand, hf = (
            peers.compiled(peers.ours, backend=backend),
            peers.compiled(peers.hf_for_compile, backend=backend),
        )
        found["compiled_expand"] = (
            "`torch.compile` (default mode) of the op on k and v",
            lambda: expand(k, v, n),
        )
        found["compiled_hf"] = ("`torch.compile` (default mode) of Hugging Face's", lambda: hf(k, v, n))
    if device == "cuda":
        # The kernel launch under an eager call: Triton's compiled handle called directly,
        # as the call does, on results allocated once (what is left is checks, allocation
        # and the Python around them).
        launch = gqa_triton.expand_launch(k, v, n)
        out_k, out_v = launch(k, v)  # the first call compiles and keeps the direct launch
        run = launch.direct_run(k, v)
        if run is not None and out_v is not None:
            pointers = (k.data_ptr(), v.data_ptr(), out_k.data_ptr(), out_v.data_ptr())
            found["floor_launch"] = (
                "floor: the expansion's cached kernel launch alone",
                lambda: run(*pointers),
            )
        found["graph_expand"] = (
            "a CUDA graph replay of `gqa_expand`",
            timing.capture([lambda: ours(k, v)]).replay,
        )
        found["graph_hf"] = (
            "a CUDA graph replay of Hugging Face's",
            timing.capture([lambda: theirs(k, v)]).replay,
        )
    return found


def steps(
    report: Report, shape: Shape, dtype: str, device: str, effort: timing.Effort, backend: str
) -> list[Step]:
    def measure() -> None:
        found = candidates(shape, getattr(torch, dtype), device, backend)
        us = timing.wall_us({name: fn for name, (_, fn) in found.items()}, device, effort)
        rows = [{"name": name, "call": call, "us": us[name]} for name, (call, _) in found.items()]
        report["host"] = {"shape": asdict(shape), "dtype": dtype, "rows": rows}

    return [("host: every candidate, interleaved rounds", measure)]

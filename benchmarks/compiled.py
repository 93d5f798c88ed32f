"""The op inside ``torch.compile`` graphs against compiled ``repeat_kv``: the expansion alone,
and followed by a multiply as a model would use it (Inductor can fuse ``repeat_kv``'s copy
into the multiply). On the small shape the host's time per call (``wall_us``); on larger
shapes the GPU's, from CUDA-graph replays (``graph_ms``; ``reduce-overhead`` mode makes
graphs of its own, so it is timed by ``wall_us`` too).

On CUDA ours twice: as the op gives itself to compilers (the expansion in ATen ops), and
with our expansion kernel in the graph instead (``neuralops_kernel``, a benchmark-only op
whose body is the kernel's launch): the measurement behind that choice.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import asdict

import torch
from torch import Tensor

from benchmarks import peers, timing
from benchmarks.cases import Shape
from benchmarks.results import Report, Step

WORKLOADS = ("expand", "expand_scale")


@functools.cache
def kernel_form_op() -> None:
    """Define ``torch.ops.neuralops_bench.gqa_expand_kernel`` (before any compilation: dynamo
    can't trace a definition)."""
    from csrc_free_ops import gqa_triton

    @torch.library.triton_op("neuralops_bench::gqa_expand_kernel", mutates_args=())
    def gqa_expand_kernel(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
        return gqa_triton.expand_forward(k, v, num_heads // num_kv_heads, traced=True)

    @gqa_expand_kernel.register_fake  # type: ignore[untyped-decorator]
    def _(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
        return peers.EXPAND.default(k, v, num_kv_heads, num_heads)  # type: ignore[no-any-return]


@functools.cache
def workload(name: str, provider: str) -> Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]:
    """The function compiled for ``name`` and ``provider``, with a code object of its own (dynamo
    caches per code object, so no two variants share compilations)."""

    def body(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
        if provider == "neuralops":
            k, v = peers.EXPAND(k, v, k.shape[1], k.shape[1] * n_rep)
        elif provider == "neuralops_kernel":
            k, v = torch.ops.neuralops_bench.gqa_expand_kernel(k, v, k.shape[1], k.shape[1] * n_rep)
        else:
            k, v = peers.hf(k, v, n_rep)
        return (k * 0.5, v * 0.5) if name == "expand_scale" else (k, v)

    code = body.__code__.replace(co_name=f"{name}_{provider}")
    return types.FunctionType(code, body.__globals__, code.co_name, None, body.__closure__)


def _call(fn: Callable[..., object], mark_step: bool, k: Tensor, v: Tensor, n_rep: int) -> None:
    if mark_step:  # CUDA graph trees: a step per call, so a replay may reuse the last outputs' memory
        torch.compiler.cudagraph_mark_step_begin()
    fn(k, v, n_rep)


def steps(report: Report, small: Shape, shapes: list[Shape], dtype: str, device: str, effort: timing.Effort,
          modes: list[str], backend: str) -> list[Step]:  # fmt: skip
    section = report.setdefault("compiled", {"dtype": dtype, "rows": []})
    providers = ["neuralops", *(["neuralops_kernel"] if device == "cuda" else []), "compiled_hf"]
    torch_dtype = getattr(torch, dtype)

    def measure(shape: Shape, name: str, mode: str) -> None:
        if device == "cuda":
            kernel_form_op()
        fns = {p: peers.compiled(workload(name, p), mode, backend) for p in providers}
        marked = mode == "reduce-overhead"
        if shape is small or marked or device != "cuda":
            k, v = shape.tensors(torch_dtype, device)
            calls = {p: functools.partial(_call, fn, marked, k, v, shape.n_rep) for p, fn in fns.items()}
            for call in [*calls.values()] * 3:  # compile, then (reduce-overhead) warm up and record
                call()
            kind, times = "wall_us", timing.wall_us(calls, device, effort)
        else:
            sets = timing.input_sets(shape, torch_dtype, device)
            graph = {p: [functools.partial(fn, a, b, shape.n_rep) for a, b in sets] for p, fn in fns.items()}
            kind, times = "graph_ms", {p: timing.graph_ms(calls, effort) for p, calls in graph.items()}
        row = {"shape": asdict(shape), "workload": name, "mode": mode, "timing": kind, "times": times}
        section["rows"].append({**row, "bytes": shape.minimal_bytes(torch_dtype.itemsize)})

    cases = [(s, w, m) for s in (small, *shapes) for w in WORKLOADS for m in modes]
    return [(f"compiled {s.name} {w} {m}", functools.partial(measure, s, w, m)) for s, w, m in cases]

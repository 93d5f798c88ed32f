"""Benchmark of the GQA expansion against its peers: ``python -m benchmarks.bench``.

Every figure comes from one run on one device. On CUDA: the copy ceiling (a large
device-to-device copy, bytes read + written), then per shape, dtype and direction the
median GPU time of each provider over CUDA-graph replays, GB/s for the minimal bytes of the
job, percent of the ceiling and our speedup over each peer; the host cost of an eager call;
the op inside ``torch.compile`` graphs against compiled ``repeat_kv``; peak memory. Writes
JSON, Markdown (rendered by :mod:`benchmarks.markdown`, the same code that renders
the committed figures in the docs) and a plot.

On a CPU the op runs its PyTorch reference, so a CPU run checks that the benchmark works
and compares the reference with its peers by wall clock; it is not a kernel benchmark.

Not for: choosing launch settings at run time (``--sweep`` only reports candidates).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import Tensor

import neuralops_gqa
from benchmarks import cli, markdown

# Re-exported: ``python -m neuralops_gqa`` imports it from here.
from neuralops_gqa.selfcheck import DTYPES, hf_repeat_kv

Fn = Callable[[], object]
Pair = Callable[[Tensor, Tensor], object]
SCHEMA = 2


@dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    kv_heads: int
    heads: int
    seq: int
    dim: int
    bnhd: bool = False  # k and v given as transposed [B, N, H, D] views

    @property
    def n_rep(self) -> int:
        return self.heads // self.kv_heads

    def minimal_bytes(self, itemsize: int) -> int:
        """Both tensors: each input element read once, each output element written once."""
        return 2 * (1 + self.n_rep) * self.batch * self.kv_heads * self.seq * self.dim * itemsize

    def describe(self) -> str:
        return markdown.describe(asdict(self))

    def scaled(self, max_bytes: int, itemsize: int) -> Shape:
        """The same heads and head dim with the sequence (then the batch) halved until the
        job moves at most ``max_bytes``: a CPU or a smoke test runs every named shape."""
        shape = self
        while shape.minimal_bytes(itemsize) > max_bytes:
            if shape.seq > 16:
                shape = replace(shape, seq=(shape.seq + 1) // 2)
            elif shape.batch > 1:
                shape = replace(shape, batch=(shape.batch + 1) // 2)
            elif shape.seq > 1:
                shape = replace(shape, seq=(shape.seq + 1) // 2)
            else:
                break
        return shape


SHAPES = [
    Shape("llama3-8b", 4, 8, 32, 4096, 128),
    Shape("llama3-70b", 2, 8, 64, 8192, 128),
    Shape("qwen2-7b", 4, 4, 28, 4096, 128),
    Shape("mqa", 4, 1, 71, 2048, 64),
    Shape("gemma2", 2, 8, 16, 4096, 256),
    Shape("long-context", 1, 8, 32, 32768, 128),
    Shape("many-short", 64, 8, 32, 128, 128),
    Shape("small", 1, 8, 32, 512, 128),
    Shape("llama3-8b-bnhd", 4, 8, 32, 4096, 128, bnhd=True),
    # Other head counts: Phi-3-medium keeps 10 KV heads for 40 query heads (n_rep 4, not a
    # power of two in the KV head count).
    Shape("phi3-medium", 2, 10, 40, 4096, 128),
    # Head dims below 128, two of them not powers of two (masked tiles).
    Shape("head-dim-64", 4, 8, 32, 4096, 64),
    Shape("head-dim-80", 4, 8, 32, 4096, 80),
    Shape("head-dim-96", 4, 8, 32, 4096, 96),
    # Batched decoding: many sequences, each with a filled KV cache.
    Shape("decode-batch", 32, 8, 32, 2048, 128),
    # Another transposed projection, with a KV head count that is not a power of two.
    Shape("qwen2-7b-bnhd", 4, 4, 28, 4096, 128, bnhd=True),
]
SHAPES_BY_NAME = {s.name: s for s in SHAPES}
SMALL = "small"
# A CPU runs these by default (scaled down, see --max-mb); any name can be asked for.
CPU_DEFAULT_SHAPES = ("llama3-8b", "mqa", SMALL)
CPU_MAX_MB = 32.0
# The compiled-graph section times GPU work on these shapes only (what a full run can
# afford: every shape costs 8 compilations): the commonest GQA shape, MQA (71 copies per
# head) and the widest head dim.
COMPILED_SHAPES = ("llama3-8b", "mqa", "gemma2")
PARTS = ("kernels", "host", "compiled", "memory")

# The names --dtypes accepts: the self-check's table, PyTorch's names and the short forms.
DTYPE_ALIASES = DTYPES


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Effort:
    """How many repetitions each measurement takes; ``--quick`` is for smoke tests."""

    bench_warmup_ms: int = 25
    bench_rep_ms: int = 100
    cpu_min_calls: int = 5
    cpu_max_calls: int = 50
    cpu_seconds: float = 0.5
    host_warmup_calls: int = 50
    host_rounds: int = 15
    host_calls: int = 500
    loop_rounds: int = 5


FULL = Effort()
QUICK = Effort(5, 20, 2, 3, 0.0, 2, 2, 3, 2)


# The peers and our op, as the pairs of tensors a model expands. Each compiled variant gets
# its own function, so their compilations never share a code object's cache.
def _hf_pair(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    # Its real output: a copy, or with one KV head a broadcast view (no kernel at all, so the
    # kernel tables leave that case to the attention benchmark, where a consumer reads it).
    return hf_repeat_kv(k, n_rep), hf_repeat_kv(v, n_rep)


def _compiled_hf_pair_fn(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return _hf_pair(k, v, n_rep)


def _interleave_pair(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)


def _ours_pair(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    expanded: tuple[Tensor, Tensor] = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], k.shape[1] * n_rep)
    return expanded


def _hf_backward(gk: Tensor, gv: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    """What autograd runs for ``repeat_kv``'s backward: the reshape's view, the expand's sum."""
    b, h, n, _ = gk.shape
    return gk.view(b, h // n_rep, n_rep, n, -1).sum(2), gv.view(b, h // n_rep, n_rep, n, -1).sum(2)


def _compiled_hf_backward_fn(gk: Tensor, gv: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return _hf_backward(gk, gv, n_rep)


# The compiled-graph section: the expansion alone, and followed by a pointwise op as in a
# model (Inductor can fuse repeat_kv's copy into the multiply; it can't fuse into our op).
def _graph_expand_ours(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return _ours_pair(k, v, n_rep)


def _graph_expand_hf(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return _hf_pair(k, v, n_rep)


def _graph_scale_ours(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    k2, v2 = _ours_pair(k, v, n_rep)
    return k2 * 0.5, v2 * 0.5


def _graph_scale_hf(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return hf_repeat_kv(k, n_rep) * 0.5, hf_repeat_kv(v, n_rep) * 0.5


# The same, compiled with our expansion kernel in place of the fusable ATen form that the
# op gives compilers (what decides that choice): a benchmark-only op whose body is the
# kernel's wrap_triton launch, so compilers launch it as they launch the reduction.
@functools.cache
def kernel_form_op() -> Callable[[Tensor, Tensor, int, int], tuple[Tensor, Tensor]]:
    """``torch.ops.neuralops_bench.gqa_expand_kernel``, defined on first use."""
    from csrc_free_ops import gqa_triton

    @torch.library.triton_op("neuralops_bench::gqa_expand_kernel", mutates_args=())
    def gqa_expand_kernel(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
        return gqa_triton.expand_forward(k, v, num_heads // num_kv_heads, traced=True)

    @gqa_expand_kernel.register_fake  # type: ignore[untyped-decorator]
    def _(k: Tensor, v: Tensor, num_kv_heads: int, num_heads: int) -> tuple[Tensor, Tensor]:
        return torch.ops.neuralops.gqa_expand.default(k, v, num_kv_heads, num_heads)  # type: ignore[no-any-return]

    op: Callable[[Tensor, Tensor, int, int], tuple[Tensor, Tensor]] = (
        torch.ops.neuralops_bench.gqa_expand_kernel
    )
    return op


def _graph_expand_kernel(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    # The op by name, not kernel_form_op(): dynamo traces through functools.cache into the
    # definition, which it can't trace (graph_providers defines the op before compiling).
    return torch.ops.neuralops_bench.gqa_expand_kernel(k, v, k.shape[1], k.shape[1] * n_rep)  # type: ignore[no-any-return]


def _graph_scale_kernel(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    k2, v2 = _graph_expand_kernel(k, v, n_rep)
    return k2 * 0.5, v2 * 0.5


GRAPH_WORKLOADS: dict[str, dict[str, Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]]] = {
    "expand": {
        "neuralops": _graph_expand_ours,
        "neuralops_kernel": _graph_expand_kernel,
        "compiled_hf": _graph_expand_hf,
    },
    "expand_scale": {
        "neuralops": _graph_scale_ours,
        "neuralops_kernel": _graph_scale_kernel,
        "compiled_hf": _graph_scale_hf,
    },
}


_RECOMPILE_LIMITS = (
    "recompile_limit",
    "cache_size_limit",
    "accumulated_recompile_limit",
    "accumulated_cache_size_limit",
)


def graph_providers(workload: str, device: str) -> list[str]:
    """The compiled-graph providers a device runs: our kernel form exists on CUDA only (on a
    CPU the op's compiled form is the reference either way)."""
    if device == "cuda":
        kernel_form_op()  # defined before any compilation: dynamo can't trace an op definition
        return list(GRAPH_WORKLOADS[workload])
    return [p for p in GRAPH_WORKLOADS[workload] if p != "neuralops_kernel"]


@contextlib.contextmanager
def lifted_recompile_limits() -> Iterator[None]:
    """One specialised graph per shape and dtype: lift dynamo's recompile cap for the run
    (so no shape falls back to eager), and put it back afterwards."""
    config = torch._dynamo.config
    saved = {n: getattr(config, n) for n in _RECOMPILE_LIMITS if hasattr(config, n)}
    try:
        for name in saved:
            setattr(config, name, 1024)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


@functools.cache
def compiled(fn: Callable[..., Any], mode: str = "default", backend: str = "inductor") -> Callable[..., Any]:
    """``torch.compile`` of ``fn``, made on first use (never at import) and kept for the run."""
    if backend != "inductor":  # a test's cheap backend; modes are Inductor's
        return torch.compile(fn, backend=backend, dynamic=False, fullgraph=True)
    return torch.compile(fn, mode=mode, dynamic=False, fullgraph=True)


def make_inputs(
    shape: Shape, dtype: torch.dtype, device: str, requires_grad: bool = False
) -> tuple[Tensor, Tensor]:
    def one() -> Tensor:
        if shape.bnhd:
            x = torch.randn(shape.batch, shape.seq, shape.kv_heads, shape.dim, device=device, dtype=dtype)
            x = x.transpose(1, 2)
        else:
            x = torch.randn(shape.batch, shape.kv_heads, shape.seq, shape.dim, device=device, dtype=dtype)
        return x.requires_grad_(requires_grad)

    return one(), one()


def _grad_shape(shape: Shape) -> Shape:
    return replace(shape, kv_heads=shape.heads)


def median_ms(fn: Fn, device: str, effort: Effort) -> float:
    """Median milliseconds per call: ``do_bench`` on CUDA, a wall clock elsewhere."""
    if device == "cuda":
        import triton.testing

        return float(
            triton.testing.do_bench(
                fn, warmup=effort.bench_warmup_ms, rep=effort.bench_rep_ms, return_mode="median"
            )
        )
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + effort.cpu_seconds
    while len(times) < effort.cpu_min_calls or (
        time.perf_counter() < deadline and len(times) < effort.cpu_max_calls
    ):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graph_ms(calls: list[Fn], effort: Effort) -> float:
    """Median milliseconds per call, the calls captured into one CUDA graph and replayed.

    Replaying a graph takes the host out of the measurement, so a provider's Python cost
    (ours included) doesn't hide its kernels' speed; host cost is reported on its own. The
    calls use different buffers, together several times the L2 cache, so no call reads
    what the previous one left in cache. The calls run once on a side stream first, which
    also compiles whatever ``torch.compile`` has to.
    """
    import triton.testing

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = float(
        triton.testing.do_bench(
            graph.replay, warmup=effort.bench_warmup_ms, rep=effort.bench_rep_ms, return_mode="median"
        )
    )
    del graph
    return ms / len(calls)


def loop_ms(calls: list[Fn], device: str, effort: Effort) -> float:
    """Median over rounds of the time per call of a loop through ``calls``, between two
    device events (CUDA) or by wall clock: host and GPU overlap as in a model, so this is
    the slower of the two. For what can't be captured into a graph (CUDA graph trees)."""
    for call in calls:
        call()
    per_round = 4 * len(calls) if device == "cuda" else len(calls)
    samples: list[float] = []
    for _ in range(effort.loop_rounds):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for i in range(per_round):
                calls[i % len(calls)]()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / per_round)
        else:
            t0 = time.perf_counter()
            for i in range(per_round):
                calls[i % len(calls)]()
            samples.append((time.perf_counter() - t0) * 1e3 / per_round)
    return statistics.median(samples)


def buffer_sets(nbytes: int, device: str) -> int:
    """How many input sets make the rotation at least 4x the L2 cache (at most 8)."""
    if device != "cuda":
        return 1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(8, -(-4 * l2 // max(nbytes, 1))))


SAME_SIZE_COPY = "same_size_copy"


def same_size_copies(nbytes: int, device: str) -> list[Fn]:
    """Device-to-device copies that move ``nbytes`` (read + written), rotating over buffers
    several times the L2: the limit a job of that size can reach, timed beside it."""
    half = nbytes // 2
    pairs = [
        (
            torch.empty(half, dtype=torch.uint8, device=device),
            torch.empty(half, dtype=torch.uint8, device=device),
        )
        for _ in range(max(2, buffer_sets(half, device)))
    ]
    return [functools.partial(dst.copy_, src) for src, dst in pairs]


def copy_ceiling_gbs(device: str, effort: Effort) -> float:
    """GB/s of a 1 GiB device-to-device copy, counting bytes read + written."""
    nbytes = 2**30
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), device, effort)
    return 2 * nbytes / ms / 1e6


def kernel_providers(
    shape: Shape, direction: str, device: str, compiled_peers: bool = True
) -> dict[str, Callable[[Tensor, Tensor], object]]:
    """Forward: both tensors expanded. Backward: both gradients reduced (the kernel work of
    the backward pass, without the autograd engine's host cost)."""
    n_rep, kv, heads = shape.n_rep, shape.kv_heads, shape.heads
    providers: dict[str, Callable[[Tensor, Tensor], object]]
    if direction == "forward":
        providers = {
            "neuralops": lambda k, v: _ours_pair(k, v, n_rep),
            "repeat_interleave": lambda k, v: _interleave_pair(k, v, n_rep),
        }
        if kv > 1:  # one KV head: Hugging Face's repeat_kv returns a view, compiled or not
            providers["hf_eager"] = lambda k, v: _hf_pair(k, v, n_rep)
            if device == "cuda" and compiled_peers:
                providers["compiled_hf"] = lambda k, v: compiled(_compiled_hf_pair_fn)(k, v, n_rep)
        return providers
    providers = {
        "neuralops": lambda gk, gv: torch.ops.neuralops.gqa_reduce(gk, gv, kv, heads),
        "hf_eager": lambda gk, gv: _hf_backward(gk, gv, n_rep),
    }
    if device == "cuda" and compiled_peers:
        providers["compiled_hf"] = lambda gk, gv: compiled(_compiled_hf_backward_fn)(gk, gv, n_rep)
    return providers


class Interleaved:
    """Wall-clock microseconds per call of several candidates. Rounds interleave the
    candidates so that drift in the host's speed (clocks, other processes) lands on all of
    them alike; the median round is reported."""

    def __init__(self, candidates: list[tuple[str, Fn]], device: str, effort: Effort) -> None:
        self.candidates, self.device, self.effort = candidates, device, effort
        self.samples: dict[str, list[float]] = {name: [] for name, _ in candidates}

    def warmup(self) -> None:
        for _, fn in self.candidates:
            for _ in range(self.effort.host_warmup_calls):
                fn()

    def round(self) -> None:
        calls = self.effort.host_calls
        for name, fn in self.candidates:
            if self.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if self.device == "cuda":
                torch.cuda.synchronize()
            self.samples[name].append((time.perf_counter() - start) / calls * 1e6)

    def medians(self) -> dict[str, float]:
        return {name: statistics.median(vals) for name, vals in self.samples.items()}


def host_candidates(shape: Shape, dtype: torch.dtype, device: str) -> list[tuple[str, Fn]]:
    """An eager call of the op and of Hugging Face's two copies, and where our time goes."""
    k, v = make_inputs(shape, dtype, device)
    n_rep = shape.n_rep
    candidates: list[tuple[str, Fn]] = [
        ("neuralops", lambda: _ours_pair(k, v, n_rep)),
        ("neuralops_repeat_kv_k_only", lambda: neuralops_gqa.repeat_kv(k, n_rep)),
        ("hf_eager", lambda: _hf_pair(k, v, n_rep)),
        # The two output allocations alone, and the launcher without the dispatcher.
        ("two_empty", lambda: (torch.empty_like(k), torch.empty_like(v))),
    ]
    if device == "cuda":
        from csrc_free_ops import gqa_triton

        no_v = k.narrow(3, 0, 0)
        kv = k.shape[1]
        candidates += [
            ("launcher_only", lambda: gqa_triton.expand_forward(k, v, n_rep)),
            ("op_k_with_zero_width_v", lambda: torch.ops.neuralops.gqa_expand(k, no_v, kv, kv * n_rep)),
            ("launcher_k_with_zero_width_v", lambda: gqa_triton.expand_forward(k, no_v, n_rep)),
        ]
    return candidates


def _compiled_call(fn: Callable[..., object], step: bool, k: Tensor, v: Tensor, n_rep: int) -> None:
    if step:  # CUDA graph trees: one step per call, so a replay may reuse the last outputs' memory
        torch.compiler.cudagraph_mark_step_begin()
    fn(k, v, n_rep)


def compiled_modes(device: str) -> list[str]:
    return ["default", "reduce-overhead"] if device == "cuda" else ["default"]


def peak_memory_ratio(shape: Shape, dtype: torch.dtype) -> dict[str, float]:
    """Peak bytes allocated during our forward / backward over the bytes of their results."""
    k, v = make_inputs(shape, dtype, "cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    outs = _ours_pair(k, v, shape.n_rep)
    fwd = (torch.cuda.max_memory_allocated() - base) / sum(o.nbytes for o in outs)
    grads = [torch.randn_like(o) for o in outs]
    del outs
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    res = torch.ops.neuralops.gqa_reduce(*grads, shape.kv_heads, shape.heads)
    bwd = (torch.cuda.max_memory_allocated() - base) / sum(r.nbytes for r in res)
    return {"forward": fwd, "backward": bwd}


class Progress:
    """A one-line progress bar on stderr over weighted steps (a compilation weighs more
    than a timing), with the elapsed time."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr

    def step(self, label: str, units: int = 1) -> None:
        self.done += units
        width = 30
        filled = width * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (width - filled)
        elapsed = time.perf_counter() - self.start
        pct = 100 * self.done // max(self.total, 1)
        self.stream.write(f"\r[{bar}] {pct:3d}% {self.done}/{self.total} {elapsed:5.0f}s {label[:48]:<48}")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


@dataclass
class Step:
    """One timed unit of the run: a measurement, a compilation with its measurement, a round.

    An ``optional`` step that fails is recorded in the report's ``errors`` and the run goes
    on (the compiled-graph section depends on what the installed torch can compile)."""

    label: str
    run: Callable[[], None]
    units: int = 1
    optional: bool = False
    part: str = ""


COMPILE_UNITS = 4  # a compilation takes seconds; a timing a fraction of one


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def machine_info(device: str) -> dict[str, str]:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "neuralops_gqa": neuralops_gqa.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["sms"] = str(props.multi_processor_count)
        info["l2_mb"] = str(props.L2_cache_size // 2**20)
        info["cuda"] = str(torch.version.cuda)
        driver = _nvidia_driver()
        if driver:
            info["driver"] = driver
    return info


@dataclass(frozen=True)
class Plan:
    """What one run measures."""

    shapes: list[Shape]
    dtypes: list[torch.dtype]
    device: str
    parts: tuple[str, ...] = PARTS
    backward: bool = True
    effort: Effort = FULL
    compiled_shapes: tuple[str, ...] = COMPILED_SHAPES
    compile_backend: str = "inductor"
    compiled_peers: bool = True  # time torch.compile of repeat_kv in the kernel tables

    @property
    def graph_dtype(self) -> torch.dtype:
        """The compiled-graph section runs in one dtype: bfloat16 when asked for, else the first."""
        return torch.bfloat16 if torch.bfloat16 in self.dtypes else self.dtypes[0]

    @property
    def small(self) -> Shape | None:
        return next((s for s in self.shapes if s.name == SMALL), None)


def _kernel_steps(plan: Plan, report: dict[str, Any]) -> list[Step]:
    steps: list[Step] = []
    times: dict[tuple[str, str, str], dict[str, float]] = {}
    directions = ["forward", "backward"] if plan.backward else ["forward"]
    device, effort = plan.device, plan.effort

    def measure(shape: Shape, dtype: torch.dtype, direction: str, name: str, provider: Pair | None) -> None:
        in_shape = shape if direction == "forward" else _grad_shape(shape)
        itemsize = dtype.itemsize
        calls: list[Fn]
        if provider is None:  # the limit at this size: a plain copy of the same bytes
            calls = same_size_copies(shape.minimal_bytes(itemsize), device)
        else:
            in_bytes = 2 * in_shape.batch * in_shape.kv_heads * shape.seq * shape.dim * itemsize
            sets = [make_inputs(in_shape, dtype, device) for _ in range(buffer_sets(in_bytes, device))]
            calls = [functools.partial(provider, a, b) for a, b in sets]
            del sets
        ms = graph_ms(calls, effort) if device == "cuda" else median_ms(calls[0], device, effort)
        times.setdefault((dtype_name(dtype), shape.name, direction), {})[name] = ms
        del calls
        if device == "cuda":
            torch.cuda.empty_cache()

    for dtype in plan.dtypes:
        for shape in plan.shapes:
            for direction in directions:
                providers: dict[str, Pair | None] = {
                    **kernel_providers(shape, direction, device, plan.compiled_peers)
                }
                if device == "cuda":
                    providers[SAME_SIZE_COPY] = None
                for name, provider in providers.items():
                    units = COMPILE_UNITS if name.startswith("compiled") else 1
                    steps.append(
                        Step(
                            f"{dtype_name(dtype)} {shape.name} {direction} {name}",
                            functools.partial(measure, shape, dtype, direction, name, provider),
                            units,
                        )
                    )

    def assemble() -> None:
        ceiling = report.get("ceiling_gbs")
        rows = []
        for (dtype, name, direction), t in times.items():
            shape = next(s for s in plan.shapes if s.name == name)
            nbytes = shape.minimal_bytes(getattr(torch, dtype).itemsize)
            copy_ms = t.pop(SAME_SIZE_COPY, None)
            row: dict[str, Any] = {
                "shape": asdict(shape),
                "dtype": dtype,
                "direction": direction,
                "bytes": nbytes,
                "median_ms": t,
                "gbs": {p: nbytes / ms / 1e6 for p, ms in t.items()},
                "speedup": {p: ms / t["neuralops"] for p, ms in t.items() if p != "neuralops"},
            }
            if copy_ms is not None:
                row["same_size_copy_ms"] = copy_ms
                row["pct_of_copy"] = 100 * copy_ms / t["neuralops"]
            if ceiling:
                row["pct_of_ceiling"] = {p: 100 * nbytes / ms / 1e6 / ceiling for p, ms in t.items()}
            rows.append(row)
        report["results"] = rows

    steps.append(Step("tables", assemble, 0))
    return steps


def _host_steps(plan: Plan, report: dict[str, Any]) -> list[Step]:
    small = plan.small
    if small is None:
        return []
    box: dict[str, Interleaved] = {}

    def setup() -> None:
        box["h"] = Interleaved(
            host_candidates(small, plan.graph_dtype, plan.device), plan.device, plan.effort
        )
        box["h"].warmup()

    def finish() -> None:
        report["host_overhead_us"] = box.pop("h").medians()
        report["host_shape"] = asdict(small)

    steps = [Step("host: warm-up", setup)]
    steps += [Step(f"host: round {i + 1}", lambda: box["h"].round()) for i in range(plan.effort.host_rounds)]
    return [*steps, Step("host", finish, 0)]


def _compiled_steps(plan: Plan, report: dict[str, Any]) -> list[Step]:
    """Our op against compiled ``repeat_kv`` inside ``torch.compile`` graphs, for the expansion
    alone and followed by a multiply, in every mode: wall-clock per call on the small shape
    (host-bound), GPU time on the larger shapes."""
    device, effort, dtype = plan.device, plan.effort, plan.graph_dtype
    modes = compiled_modes(device)
    section: dict[str, Any] = {"dtype": dtype_name(dtype), "modes": modes, "host_us": None, "gpu": []}
    steps: list[Step] = []
    small = plan.small
    if small is not None:
        inputs: dict[str, tuple[Tensor, Tensor]] = {}
        candidates: list[tuple[str, Fn]] = []

        def add(workload: str, mode: str, provider: str) -> None:
            if "kv" not in inputs:
                inputs["kv"] = make_inputs(small, dtype, device)
            a, b = inputs["kv"]
            fn = compiled(GRAPH_WORKLOADS[workload][provider], mode, plan.compile_backend)
            call = functools.partial(_compiled_call, fn, mode == "reduce-overhead", a, b, small.n_rep)
            for _ in range(3):  # compile, then (reduce-overhead) warm up and record the graph
                call()
            candidates.append((f"{workload}/{mode}/{provider}", call))

        for workload in GRAPH_WORKLOADS:
            for mode in modes:
                for provider in graph_providers(workload, device):
                    steps.append(
                        Step(
                            f"compile {workload} {mode} {provider} (small)",
                            functools.partial(add, workload, mode, provider),
                            COMPILE_UNITS,
                            optional=True,
                        )
                    )
        box: dict[str, Interleaved] = {}

        def start() -> None:
            box["c"] = Interleaved(candidates, device, effort)
            box["c"].warmup()

        def finish() -> None:
            medians = box.pop("c").medians()
            rows = []
            for workload in GRAPH_WORKLOADS:
                for mode in modes:
                    keys = {p: f"{workload}/{mode}/{p}" for p in graph_providers(workload, device)}
                    if all(k in medians for k in keys.values()):  # a failed compilation drops the row
                        rows.append(
                            {"workload": workload, "mode": mode, **{p: medians[k] for p, k in keys.items()}}
                        )
            section["host_us"] = {"shape": asdict(small), "rows": rows}
            inputs.clear()

        steps.append(Step("compiled: warm-up (small)", start, optional=True))
        steps += [
            Step(f"compiled: round {i + 1} (small)", lambda: box["c"].round(), optional=True)
            for i in range(effort.host_rounds)
        ]
        steps.append(Step("compiled (small)", finish, 0, optional=True))

    def measure(shape: Shape, workload: str, mode: str, provider: str) -> None:
        in_bytes = 2 * shape.batch * shape.kv_heads * shape.seq * shape.dim * dtype.itemsize
        sets = [make_inputs(shape, dtype, device) for _ in range(buffer_sets(in_bytes, device))]
        fn = compiled(GRAPH_WORKLOADS[workload][provider], mode, plan.compile_backend)
        step = mode == "reduce-overhead"
        calls: list[Fn] = [functools.partial(_compiled_call, fn, step, a, b, shape.n_rep) for a, b in sets]
        if device == "cuda" and not step:
            ms, timing = graph_ms(calls, effort), "graph_replay"
        else:
            for call in calls:  # compile, warm up, record
                call()
                call()
            ms, timing = loop_ms(calls, device, effort), "loop"
        rows = section["gpu"]
        row = next(
            (
                r
                for r in rows
                if (r["shape"]["name"], r["workload"], r["mode"]) == (shape.name, workload, mode)
            ),
            None,
        )
        if row is None:
            row = {
                "shape": asdict(shape),
                "workload": workload,
                "mode": mode,
                "bytes": shape.minimal_bytes(dtype.itemsize),
                "timing": timing,
                "median_ms": {},
            }
            rows.append(row)
        row["median_ms"][provider] = ms
        del calls, sets
        if device == "cuda":
            torch.cuda.empty_cache()

    for shape in plan.shapes:
        if shape.name not in plan.compiled_shapes:
            continue
        for workload in GRAPH_WORKLOADS:
            for mode in modes:
                for provider in graph_providers(workload, device):
                    steps.append(
                        Step(
                            f"compiled {workload} {mode} {provider} {shape.name}",
                            functools.partial(measure, shape, workload, mode, provider),
                            COMPILE_UNITS,
                            optional=True,
                        )
                    )

    def store() -> None:
        report["compiled"] = section

    return [*steps, Step("compiled", store, 0)]


def _memory_steps(plan: Plan, report: dict[str, Any]) -> list[Step]:
    if plan.device != "cuda" or not plan.shapes:
        return []
    shape, dtype = plan.shapes[0], plan.graph_dtype

    def measure() -> None:
        report["peak_memory_ratio"] = {shape.name: peak_memory_ratio(shape, dtype)}

    return [Step(f"peak memory {shape.name}", measure, optional=True)]


def plan_steps(plan: Plan, report: dict[str, Any]) -> list[Step]:
    """Every timed unit of a run, in order, so the progress bar can count them up front."""
    steps: list[Step] = []
    if plan.device == "cuda":

        def ceiling() -> None:
            report["ceiling_gbs"] = copy_ceiling_gbs(plan.device, plan.effort)

        steps.append(Step("copy ceiling", ceiling))
    makers = {
        "kernels": _kernel_steps,
        "host": _host_steps,
        "compiled": _compiled_steps,
        "memory": _memory_steps,
    }
    for part in PARTS:
        if part in plan.parts:
            for step in makers[part](plan, report):
                step.part = part
                steps.append(step)
    return steps


def run(plan: Plan, stream: TextIO | None = None, command: list[str] | None = None) -> dict[str, Any]:
    """Measure what ``plan`` asks for; return the report (the JSON the docs are rendered from)."""
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "machine": machine_info(plan.device),
        "device": plan.device,
        "command": command,
        "parts": list(plan.parts),
        "dtypes": [dtype_name(d) for d in plan.dtypes],
        "ceiling_gbs": None,
    }
    steps = plan_steps(plan, report)
    progress = Progress(sum(s.units for s in steps), stream)
    start = time.perf_counter()
    errors: list[dict[str, str]] = []
    with lifted_recompile_limits():
        for step in steps:
            try:
                step.run()
            except Exception as err:
                if not step.optional:
                    raise
                message = f"{type(err).__name__}: {err}"[:500]
                errors.append({"part": step.part, "step": step.label, "error": message})
                print(f"\n{step.label}: {type(err).__name__}: {err}", file=sys.stderr)
            if step.units:
                progress.step(step.label, step.units)
    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    if errors:
        report["errors"] = errors
    return report


PART_KEYS = {
    "kernels": ("results",),
    "host": ("host_overhead_us", "host_shape"),
    "compiled": ("compiled",),
    "memory": ("peak_memory_ratio",),
}


def merge_reports(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the parts ``new`` measured replaced by ``new``'s: one report from runs
    that each measured some parts on the same machine. The kernel tables keep the ceiling
    of the run that timed them."""
    if old.get("machine", {}).get("gpu") != new.get("machine", {}).get("gpu") or old.get("device") != new.get(
        "device"
    ):
        raise ValueError("--merge: the existing bench.json comes from another device")
    merged = dict(old)
    for part in new.get("parts", []):
        for key in PART_KEYS[part]:
            merged.pop(key, None)
            if key in new:
                merged[key] = new[key]
    if "kernels" in new.get("parts", []):
        merged["ceiling_gbs"] = new["ceiling_gbs"]
    merged["parts"] = [p for p in PARTS if p in set(old.get("parts", [])) | set(new.get("parts", []))]
    merged["dtypes"] = list(dict.fromkeys([*old.get("dtypes", []), *new.get("dtypes", [])]))
    merged["command"] = [*(old.get("command") or []), "&&", *(new.get("command") or [])]
    merged["elapsed_s"] = round(old.get("elapsed_s", 0.0) + new.get("elapsed_s", 0.0), 1)
    errors = [e for e in old.get("errors", []) if e.get("part") not in new["parts"]]
    errors += new.get("errors", [])
    merged.pop("errors", None)
    if errors:
        merged["errors"] = errors
    return merged


def plot(report: dict[str, Any], path: Path) -> None:
    """GB/s per shape and provider, forward above backward, in the report's first dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report.get("results") or []
    if not results:
        return
    rows = [r for r in results if r["dtype"] == results[0]["dtype"]]
    n_shapes = len({r["shape"]["name"] for r in rows})
    fig, axes = plt.subplots(2, 1, figsize=(max(12, 1.0 * n_shapes), 9), sharey=True)
    for ax, direction in zip(axes, ("forward", "backward")):
        sub = [r for r in rows if r["direction"] == direction]
        if not sub:
            ax.set_visible(False)
            continue
        providers = list(sub[0]["gbs"])
        width = 0.8 / len(providers)
        for i, p in enumerate(providers):
            xs = [j + i * width for j in range(len(sub))]
            ax.bar(xs, [r["gbs"].get(p, 0) for r in sub], width, label=p)
        if report.get("ceiling_gbs"):
            ax.axhline(report["ceiling_gbs"], color="black", linestyle="--", label="copy ceiling")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sub))])
        ax.set_xticklabels([r["shape"]["name"] for r in sub], rotation=25, ha="right")
        ax.set_ylabel("GB/s (minimal bytes)")
        where = report["machine"].get("gpu") or f"CPU ({report['machine']['cpu']}), PyTorch reference"
        ax.set_title(f"{direction}, {sub[0]['dtype']}, {where}")
        ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SWEEP_FORWARD: dict[str, tuple[int, ...]] = {
    "TILE_BYTES": (4096, 8192),
    "BYTES_PER_WARP": (1024, 2048),
    "WAVES": (4, 16),
    "REP_MAJOR_MAX_REPS": (0, 16),
    "CACHE_HINTS": (0, 1),
}
SWEEP_BACKWARD: dict[str, tuple[int, ...]] = {
    "TILE_BYTES": (4096, 8192),
    "BYTES_PER_WARP": (1024, 2048),
    "REDUCE_SHORT_GROUP_BYTES_PER_WARP": (512, 1024),
    "REDUCE_UNROLL": (8, 16),
    "CACHE_HINTS": (0, 1),
}
# The reduction of long groups (MQA) on its own: how finely to split the sequence, and how
# many warps share a tile.
SWEEP_LONG_GROUPS: dict[str, tuple[int, ...]] = {
    "LONG_GROUP_WAVES": (4, 8, 16, 32),
    "LONG_GROUP_MIN_TILE_BYTES": (256, 512, 1024, 2048),
    "LONG_GROUP_BYTES_PER_WARP": (256, 1024),
    "REDUCE_UNROLL": (8, 16),
}


def write_ceiling_gbs(effort: Effort) -> float:
    """GB/s of filling 1 GiB: the bandwidth of a write-only stream."""
    dst = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    return 2**30 / median_ms(lambda: dst.fill_(7), "cuda", effort) / 1e6


SWEEP_GRIDS = {
    "forward": ("forward", SWEEP_FORWARD),
    "backward": ("backward", SWEEP_BACKWARD),
    "long-groups": ("backward", SWEEP_LONG_GROUPS),
}


def sweep(
    shapes: list[Shape],
    dtype: torch.dtype,
    effort: Effort = FULL,
    which: tuple[str, ...] = ("forward", "backward"),
) -> dict[str, Any]:
    """Time every launch-settings candidate on every shape, forward and backward (CUDA only).

    Each candidate is a ``LaunchSettings`` value passed to the launchers (a name the settings
    don't have is a ``TypeError``), and its output is checked against ``repeat_interleave``
    once, so a fast wrong variant can't win.
    """
    from csrc_free_ops import gqa_triton
    from csrc_free_ops.launch_settings import DEFAULT

    grids = [SWEEP_GRIDS[name] for name in which]
    total = sum(len(list(itertools.product(*g.values()))) for _, g in grids)
    progress = Progress(total)
    rows = []

    def sets(s: Shape, heads: int) -> list[tuple[Tensor, Tensor]]:
        shape = replace(s, kv_heads=heads, heads=heads)
        count = buffer_sets(2 * s.batch * heads * s.seq * s.dim * dtype.itemsize, "cuda")
        return [make_inputs(shape, dtype, "cuda") for _ in range(count)]

    inputs = {s.name: sets(s, s.kv_heads) for s in shapes}
    grads = {s.name: sets(s, s.heads) for s in shapes}
    for direction, grid in grids:
        for values in itertools.product(*grid.values()):
            setting = dict(zip(grid, values))
            settings = replace(DEFAULT, **setting)
            for s in shapes:
                n_rep = s.n_rep
                calls: list[Fn]
                if direction == "forward":
                    k, v = inputs[s.name][0]
                    out = gqa_triton.expand_forward(k, v, n_rep, settings=settings)
                    ok = torch.equal(out[1], v.repeat_interleave(n_rep, 1))
                    calls = [
                        functools.partial(gqa_triton.expand_forward, k, v, n_rep, settings=settings)
                        for k, v in inputs[s.name]
                    ]
                else:
                    gk, gv = grads[s.name][0]
                    out = gqa_triton.reduce_backward(gk, gv, n_rep, settings=settings)
                    ref = gv.float().unflatten(1, (s.kv_heads, n_rep)).sum(2)
                    ok = torch.allclose(out[1].float(), ref, rtol=1e-2, atol=1e-2)
                    calls = [
                        functools.partial(gqa_triton.reduce_backward, *g, n_rep, settings=settings)
                        for g in grads[s.name]
                    ]
                ms = graph_ms(calls, effort)
                rows.append({"direction": direction, "shape": s.name, **setting, "ms": ms, "correct": ok})
                del out
            progress.step(f"{direction} {values}")
    return {
        "machine": machine_info("cuda"),
        "ceiling_gbs": copy_ceiling_gbs("cuda", effort),
        "write_ceiling_gbs": write_ceiling_gbs(effort),
        "rows": rows,
    }


DESCRIPTION = """\
Time torch.ops.neuralops.gqa_expand and gqa_reduce against Hugging Face's eager repeat_kv,
repeat_interleave and torch.compile of repeat_kv, in one run on one device, and write JSON,
Markdown and a plot into --out.

On CUDA: GPU time per call from CUDA-graph replays (medians of triton.testing.do_bench), GB/s
for the minimal bytes of the job and percent of a copy ceiling measured in the same run; the
host cost of an eager call; the op inside torch.compile graphs against compiled repeat_kv.
On a CPU the op runs its PyTorch reference: shapes are scaled down (--max-mb), times are
wall clock, and the figures are not a kernel benchmark and not comparable with GPU figures.
"""


def _shapes_epilog() -> str:
    lines = ["shapes (B, H_kv->H, N, D):"]
    lines += [f"  {s.name:<16} {s.describe()}" for s in SHAPES]
    lines += [
        "",
        f"A CPU runs {', '.join(CPU_DEFAULT_SHAPES)} by default. --render rewrites the generated",
        "blocks of README.md and docs/*.md from docs/benchmarks/<gpu>.json (--check: only compare).",
    ]
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help (where there is one to show), and the description and shape list
    kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def _dtype_list(text: str) -> list[torch.dtype]:
    dtypes = []
    for item in text.split(","):
        key = item.strip().lower().removeprefix("torch.")
        if key not in DTYPE_ALIASES:
            choices = ", ".join(DTYPE_ALIASES)
            raise argparse.ArgumentTypeError(f"unknown dtype {item.strip()!r} (choose from {choices})")
        if DTYPE_ALIASES[key] not in dtypes:
            dtypes.append(DTYPE_ALIASES[key])
    return dtypes


def _name_list(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench",
        description=DESCRIPTION,
        epilog=_shapes_epilog(),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "--out", type=Path, default=Path("bench-out"), help="folder for bench.json, bench.md, bench.png"
    )
    parser.add_argument(
        "--dtypes",
        type=_dtype_list,
        default="bfloat16",
        help="comma-separated dtypes: bfloat16 (bf16), float16 (fp16, f16, half), float32 (fp32, f32, float)",
    )
    parser.add_argument(
        "--shapes",
        type=_name_list,
        default=None,
        help="comma-separated shape names (listed below); default: all on CUDA, "
        + ",".join(CPU_DEFAULT_SHAPES)
        + " on a CPU",
    )
    parser.add_argument(
        "--parts",
        type=cli.names(PARTS, "part"),
        default=",".join(PARTS),
        help="what to measure: kernels (per-shape tables), host (eager call cost), compiled "
        "(inside torch.compile graphs), memory (peak memory, CUDA only)",
    )
    parser.add_argument(
        "--compiled-shapes",
        type=_name_list,
        default=",".join(COMPILED_SHAPES),
        help="shapes whose GPU time the compiled part measures (besides the small shape's host cost)",
    )
    parser.add_argument(
        "--max-mb",
        type=cli.positive_number("MB"),
        default=None,
        help=f"scale each shape's sequence (then batch) down until it moves at most this many MB "
        f"(default: no limit on CUDA, {CPU_MAX_MB:g} on a CPU)",
    )
    parser.add_argument("--no-backward", action="store_true", help="time the forward only")
    parser.add_argument(
        "--no-compiled-peers",
        action="store_true",
        help="leave torch.compile of repeat_kv out of the kernel tables (one compilation per shape saved)",
    )
    parser.add_argument("--quick", action="store_true", help="few repetitions: a smoke test, rough figures")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="update --out's bench.json with the parts this run measures, keeping the others (a long run "
        "in several calls; same machine)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to run",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--sweep", action="store_true", help="time the launch-settings candidates instead (CUDA only)"
    )
    parser.add_argument(
        "--sweep-grids",
        default="forward,backward",
        help=f"with --sweep: which candidate grids, comma-separated ({', '.join(SWEEP_GRIDS)})",
    )
    action.add_argument(
        "--render",
        nargs="*",
        type=Path,
        metavar="JSON",
        help="rewrite the docs' generated blocks from these results (default: docs/benchmarks/<gpu>.json)",
    )
    parser.add_argument(
        "--check", action="store_true", help="with --render: fail if the docs differ, write nothing"
    )
    parser.add_argument("--root", type=Path, default=Path("."), help="with --render: the repository root")
    return parser


def select_shapes(
    parser: argparse.ArgumentParser, names: list[str] | None, device: str, max_mb: float | None,
    dtypes: list[torch.dtype],
) -> list[Shape]:  # fmt: skip
    if names is None:
        names = [s.name for s in SHAPES] if device == "cuda" else list(CPU_DEFAULT_SHAPES)
    unknown = [n for n in names if n not in SHAPES_BY_NAME]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)} (choose from {', '.join(SHAPES_BY_NAME)})")
    if not names:
        parser.error("--shapes is empty")
    shapes = [SHAPES_BY_NAME[n] for n in dict.fromkeys(names)]
    if max_mb is None and device != "cuda":
        max_mb = CPU_MAX_MB
    if max_mb is not None:
        itemsize = max(d.itemsize for d in dtypes)
        shapes = [s.scaled(int(max_mb * 2**20), itemsize) for s in shapes]
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # string defaults go through type= as well
    if args.check and args.render is None:
        parser.error("--check goes with --render")
    if args.render is not None:
        from benchmarks import docs_blocks

        missing = [str(p) for p in args.render if not p.is_file()]
        if missing:
            parser.error(f"--render: no such results file: {', '.join(missing)}")
        if not (args.root / docs_blocks.RESULTS_PAGE).is_file():
            parser.error(
                f"--render rewrites the generated blocks of a checkout's README.md and docs/; "
                f"{args.root.resolve()} has no {docs_blocks.RESULTS_PAGE} (pass --root)"
            )
        return docs_blocks.main(args.root, args.render, check=args.check)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here (use --device cpu)")
    if args.sweep and device != "cuda":
        parser.error(
            "--sweep times the Triton kernels' launch settings and needs a CUDA GPU (this run's device: cpu)"
        )
    shapes = select_shapes(parser, args.shapes, device, args.max_mb, args.dtypes)
    effort = QUICK if args.quick else FULL
    cli.output_folder(parser, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        which = tuple(args.sweep_grids.split(","))
        unknown = [w for w in which if w not in SWEEP_GRIDS]
        if unknown:
            parser.error(f"--sweep-grids: unknown {', '.join(unknown)}; choose from {', '.join(SWEEP_GRIDS)}")
        result = sweep(shapes, args.dtypes[0], effort, which)
        (args.out / "sweep.json").write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}/sweep.json")
        return 0
    unknown = [n for n in args.compiled_shapes if n not in SHAPES_BY_NAME]
    if unknown:
        parser.error(
            f"unknown shape(s) {', '.join(unknown)} in --compiled-shapes (choose from {', '.join(SHAPES_BY_NAME)})"
        )
    plan = Plan(
        shapes=shapes,
        dtypes=args.dtypes,
        device=device,
        parts=tuple(args.parts),
        backward=not args.no_backward,
        effort=effort,
        compiled_shapes=tuple(args.compiled_shapes),
        compiled_peers=not args.no_compiled_peers,
    )
    command = ["python", "-m", "benchmarks.bench", *(sys.argv[1:] if argv is None else argv)]
    report = run(plan, command=command)
    previous = args.out / "bench.json"
    if args.merge and previous.exists():
        report = merge_reports(json.loads(previous.read_text()), report)
    text = markdown.report_markdown(report)
    (args.out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "bench.md").write_text(text)
    written = "bench.json, bench.md"
    try:
        plot(report, args.out / "bench.png")
        written += ", bench.png"
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'neuralops-gqa[bench]')", file=sys.stderr)
    print(text)
    print(f"wrote {written} in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

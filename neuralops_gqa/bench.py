"""Benchmark of the GQA expansion against its peers: ``python -m neuralops_gqa.bench``.

Every figure comes from one run on one device: the copy ceiling (a large device-to-device
copy, bytes read + written), then per shape and direction the median time of each provider
(``triton.testing.do_bench`` on CUDA, wall clock on CPU), GB/s for the minimal bytes of the
job, percent of the ceiling, and our speedup over each peer. Writes JSON, Markdown and a
PNG plot. ``--sweep`` times the launch-settings candidates that ``csrc_free_ops/launch_settings.py``
chooses from.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import neuralops_gqa

Fn = Callable[[], object]


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


GPU_SHAPES = [
    Shape("llama3-8b", 4, 8, 32, 4096, 128),
    Shape("llama3-70b", 2, 8, 64, 8192, 128),
    Shape("qwen2-7b", 4, 4, 28, 4096, 128),
    Shape("mqa", 4, 1, 71, 2048, 64),
    Shape("gemma2", 2, 8, 16, 4096, 256),
    Shape("long-context", 1, 8, 32, 32768, 128),
    Shape("many-short", 64, 8, 32, 128, 128),
    Shape("small", 1, 8, 32, 512, 128),
    Shape("llama3-8b-bnhd", 4, 8, 32, 4096, 128, bnhd=True),
]
CPU_SHAPES = [
    Shape("llama-like", 1, 8, 32, 1024, 128),
    Shape("mqa", 1, 1, 16, 1024, 64),
    Shape("small", 1, 8, 32, 512, 128),
]
SMALL = "small"


def hf_repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """Hugging Face's eager formulation: a broadcast view, then a reshape that copies."""
    batch, kv_heads, seq, dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, dim)


def _hf_pair(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    # With one KV head the reshape is a stride-0 view; materialise it like every provider.
    return hf_repeat_kv(k, n_rep).contiguous(), hf_repeat_kv(v, n_rep).contiguous()


def _interleave_pair(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)


def _ours_pair(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    expanded: tuple[Tensor, Tensor] = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], k.shape[1] * n_rep)
    return expanded


_compiled_hf_pair = torch.compile(_hf_pair, dynamic=False)
# One specialised graph per shape: lift the recompile cap so no shape falls back to eager.
for _name in (
    "recompile_limit",
    "cache_size_limit",
    "accumulated_recompile_limit",
    "accumulated_cache_size_limit",
):
    if hasattr(torch._dynamo.config, _name):
        setattr(torch._dynamo.config, _name, 256)


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


def _median_ms(fn: Fn, device: str) -> float:
    if device == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + 0.5
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 50):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _graph_ms(calls: list[Fn]) -> float:
    """Median milliseconds per call, the calls captured into one CUDA graph and replayed.

    Replaying a graph takes the host out of the measurement, so a provider's Python cost
    (ours included) doesn't hide its kernels' speed; host cost is reported on its own. The
    calls use different buffers, together several times the L2 cache, so no call reads
    what the previous one left in cache.
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
    ms = float(triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median"))
    del graph
    return ms / len(calls)


def _buffer_sets(nbytes: int) -> int:
    """How many input sets make the rotation at least 4x the L2 cache (at most 8)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(8, -(-4 * l2 // max(nbytes, 1))))


def copy_ceiling_gbs(device: str) -> float:
    """GB/s of a large device-to-device copy (1 GiB on CUDA), counting bytes read + written."""
    nbytes = 2**30 if device == "cuda" else 2**27
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = _median_ms(lambda: dst.copy_(src), device)
    return 2 * nbytes / ms / 1e6


def _hf_backward(gk: Tensor, gv: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    """What autograd runs for ``repeat_kv``'s backward: the reshape's view, the expand's sum."""
    b, h, n, _ = gk.shape
    return gk.view(b, h // n_rep, n_rep, n, -1).sum(2), gv.view(b, h // n_rep, n_rep, n, -1).sum(2)


_compiled_hf_backward = torch.compile(_hf_backward, dynamic=False)


def _providers(shape: Shape, direction: str, device: str) -> dict[str, Callable[[Tensor, Tensor], object]]:
    """Forward: both tensors expanded. Backward: both gradients reduced (the kernel work of
    the backward pass, without the autograd engine's host cost)."""
    n_rep, kv, heads = shape.n_rep, shape.kv_heads, shape.heads
    if direction == "forward":
        providers: dict[str, Callable[[Tensor, Tensor], object]] = {
            "neuralops": lambda k, v: _ours_pair(k, v, n_rep),
            "hf_eager": lambda k, v: _hf_pair(k, v, n_rep),
            "repeat_interleave": lambda k, v: _interleave_pair(k, v, n_rep),
        }
        if device == "cuda":
            providers["compiled_hf"] = lambda k, v: _compiled_hf_pair(k, v, n_rep)
        return providers
    providers = {
        "neuralops": lambda gk, gv: torch.ops.neuralops.gqa_reduce(gk, gv, kv, heads),
        "hf_eager": lambda gk, gv: _hf_backward(gk, gv, n_rep),
    }
    if device == "cuda":
        providers["compiled_hf"] = lambda gk, gv: _compiled_hf_backward(gk, gv, n_rep)
    return providers


def _call(provider: Callable[[Tensor, Tensor], object], direction: str, shape: Shape, dtype: torch.dtype,
          device: str) -> Fn:  # fmt: skip
    """One timed call of ``provider`` on its own fresh inputs."""
    if direction == "forward":
        a, b = make_inputs(shape, dtype, device)
    else:
        grad_shape = Shape(
            shape.name, shape.batch, shape.heads, shape.heads, shape.seq, shape.dim, shape.bnhd
        )
        a, b = make_inputs(grad_shape, dtype, device)
    return lambda: provider(a, b)


def host_overhead_us(shape: Shape, dtype: torch.dtype, device: str, calls: int = 500) -> dict[str, float]:
    """Wall-clock microseconds per eager call, the GPU kept busy with nothing else."""
    k, v = make_inputs(shape, dtype, device)
    n_rep = shape.n_rep
    candidates: list[tuple[str, Fn]] = [
        ("neuralops", lambda: _ours_pair(k, v, n_rep)),
        ("neuralops_repeat_kv_k_only", lambda: neuralops_gqa.repeat_kv(k, n_rep)),
        ("hf_eager", lambda: _hf_pair(k, v, n_rep)),
        # Where the time goes: the two output allocations alone, and the launcher without
        # the dispatcher in front of it.
        ("two_empty", lambda: (torch.empty_like(k), torch.empty_like(v))),
    ]
    if device == "cuda":
        from csrc_free_ops import gqa_triton

        candidates.append(("launcher_only", lambda: gqa_triton.expand_forward(k, v, n_rep)))
        no_v = k.narrow(3, 0, 0)
        kv = k.shape[1]
        candidates.append(
            ("op_k_with_zero_width_v", lambda: torch.ops.neuralops.gqa_expand(k, no_v, kv, kv * n_rep))
        )
        candidates.append(("launcher_k_with_zero_width_v", lambda: gqa_triton.expand_forward(k, no_v, n_rep)))
    return _interleaved_us(candidates, device, calls)


def _interleaved_us(candidates: list[tuple[str, Fn]], device: str, calls: int) -> dict[str, float]:
    """Median wall-clock microseconds per call of each candidate. Rounds interleave the
    candidates so that drift in the host's speed (clocks, other processes) lands on all of
    them alike; the median round is reported."""
    samples: dict[str, list[float]] = {name: [] for name, _ in candidates}
    for _, fn in candidates:
        for _ in range(50):
            fn()
    for _ in range(15):
        for name, fn in candidates:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: statistics.median(vals) for name, vals in samples.items()}


def _compiled_call(compiled: Callable[..., object], step: bool, k: Tensor, v: Tensor, n_rep: int) -> None:
    if step:
        torch.compiler.cudagraph_mark_step_begin()
    compiled(k, v, n_rep)


def compiled_overhead_us(shape: Shape, dtype: torch.dtype, device: str, calls: int = 500) -> dict[str, float]:
    """Wall-clock microseconds per call of the op inside a ``torch.compile`` graph (both
    tensors), in ``default`` and ``reduce-overhead`` (CUDA graphs) mode, next to the
    compiled ``repeat_kv`` peer in the same modes."""
    k, v = make_inputs(shape, dtype, device)
    n_rep = shape.n_rep
    candidates: list[tuple[str, Fn]] = []
    modes = ["default", "reduce-overhead"] if device == "cuda" else ["default"]
    for mode in modes:
        for name, fn in (("neuralops", _ours_pair), ("hf", _hf_pair)):
            compiled: Callable[..., object] = torch.compile(fn, mode=mode, fullgraph=True)
            step = mode == "reduce-overhead"  # CUDA graph trees: one step per call
            candidates.append(
                (f"{name}_{mode}", functools.partial(_compiled_call, compiled, step, k, v, n_rep))
            )
    return _interleaved_us(candidates, device, calls)


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
    """A one-line progress bar on stderr."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def step(self, label: str) -> None:
        self.done += 1
        width = 30
        filled = width * self.done // self.total
        bar = "#" * filled + "-" * (width - filled)
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.0f}s {label[:40]:<40}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


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
        info["cuda"] = str(torch.version.cuda)
    return info


def run(shapes: list[Shape], dtypes: list[torch.dtype], device: str, backward: bool = True) -> dict[str, Any]:
    ceiling = copy_ceiling_gbs(device)
    results = []
    directions = ["forward", "backward"] if backward else ["forward"]
    n_peers = 4 if device == "cuda" else 3
    bw_peers = 3 if device == "cuda" else 2
    progress = Progress(len(shapes) * len(dtypes) * (n_peers + (bw_peers if backward else 0)))
    for dtype in dtypes:
        for shape in shapes:
            itemsize = torch.empty((), dtype=dtype).element_size()
            nbytes = shape.minimal_bytes(itemsize)
            for direction in directions:
                times: dict[str, float] = {}
                providers = _providers(shape, direction, device)
                in_bytes = 2 * shape.batch * shape.seq * shape.dim * itemsize
                in_bytes *= shape.kv_heads if direction == "forward" else shape.heads
                sets = _buffer_sets(in_bytes) if device == "cuda" else 1
                for name, provider in providers.items():
                    calls = [_call(provider, direction, shape, dtype, device) for _ in range(sets)]
                    if device == "cuda":
                        times[name] = _graph_ms(calls)
                    else:
                        times[name] = _median_ms(calls[0], device)
                    progress.step(f"{shape.name} {direction} {name}")
                    del calls
                results.append(
                    {
                        "shape": asdict(shape),
                        "dtype": str(dtype).removeprefix("torch."),
                        "direction": direction,
                        "bytes": nbytes,
                        "median_ms": times,
                        "gbs": {p: nbytes / t / 1e6 for p, t in times.items()},
                        "pct_of_ceiling": {p: 100 * nbytes / t / 1e6 / ceiling for p, t in times.items()},
                        "speedup": {p: t / times["neuralops"] for p, t in times.items() if p != "neuralops"},
                    }
                )
                if device == "cuda":
                    torch.cuda.empty_cache()
    report: dict[str, Any] = {
        "machine": machine_info(device),
        "device": device,
        "ceiling_gbs": ceiling,
        "results": results,
    }
    small = next((s for s in shapes if s.name == SMALL), None)
    if small is not None:
        report["host_overhead_us"] = host_overhead_us(small, dtypes[0], device)
        report["compiled_overhead_us"] = compiled_overhead_us(small, dtypes[0], device)
    if device == "cuda":
        report["peak_memory_ratio"] = {s.name: peak_memory_ratio(s, dtypes[0]) for s in shapes[:1]}
    return report


def to_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"Machine: {m.get('gpu', m['cpu'])}; torch {m['torch']}, triton {m['triton']}, python {m['python']}.",
        f"Copy ceiling (measured in this run): {report['ceiling_gbs']:.0f} GB/s.",
        "",
        "| shape | dtype | dir | MB | neuralops ms | GB/s | % ceiling | vs hf_eager | vs repeat_interleave | vs compiled_hf |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        s = r["shape"]
        sp = r["speedup"]
        cols = [
            s["name"],
            r["dtype"],
            r["direction"][:3],
            f"{r['bytes'] / 2**20:.0f}",
            f"{r['median_ms']['neuralops']:.4f}",
            f"{r['gbs']['neuralops']:.0f}",
            f"{r['pct_of_ceiling']['neuralops']:.1f}",
        ] + [f"{sp[p]:.2f}x" if p in sp else "-" for p in ("hf_eager", "repeat_interleave", "compiled_hf")]
        lines.append("| " + " | ".join(cols) + " |")
    if "host_overhead_us" in report:
        h = report["host_overhead_us"]
        lines += ["", f"Eager call, small shape, both tensors: neuralops {h['neuralops']:.1f} us, "
                  f"HF eager repeat_kv {h['hf_eager']:.1f} us per call."]  # fmt: skip
    if "compiled_overhead_us" in report:
        c = report["compiled_overhead_us"]
        lines.append(
            "Inside torch.compile, small shape, us per call: "
            + ", ".join(f"{k} {t:.1f}" for k, t in c.items())
            + "."
        )
    if "peak_memory_ratio" in report:
        for name, r in report["peak_memory_ratio"].items():
            lines.append(
                f"Peak memory / result bytes ({name}): forward {r['forward']:.3f}, backward {r['backward']:.3f}."
            )
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["results"] if r["dtype"] == report["results"][0]["dtype"]]
    fig, axes = plt.subplots(2, 1, figsize=(12, 8), sharey=True)
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
        ax.axhline(report["ceiling_gbs"], color="black", linestyle="--", label="copy ceiling")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sub))])
        ax.set_xticklabels([r["shape"]["name"] for r in sub], rotation=20)
        ax.set_ylabel("GB/s (minimal bytes)")
        ax.set_title(f"{direction}, {sub[0]['dtype']}, {report['machine'].get('gpu', report['device'])}")
        ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SWEEP_FORWARD: dict[str, tuple[int, ...]] = {
    "TILE_BYTES": (4096, 8192),
    "BYTES_PER_WARP": (1024, 2048),
    "TARGET_PROGRAMS": (528, 2112),
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


def write_ceiling_gbs() -> float:
    """GB/s of filling 1 GiB: the bandwidth of a write-only stream."""
    dst = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    return 2**30 / _median_ms(lambda: dst.fill_(7), "cuda") / 1e6


def sweep(shapes: list[Shape], dtype: torch.dtype) -> dict[str, Any]:
    """Time every launch-settings candidate on every shape, forward and backward (CUDA only).

    Each candidate's output is checked against ``repeat_interleave`` once, so a fast wrong
    variant can't win.
    """
    import itertools

    from csrc_free_ops import gqa_triton, launch_settings

    grids = {"forward": SWEEP_FORWARD, "backward": SWEEP_BACKWARD}
    names = {n for g in grids.values() for n in g}
    saved = {n: getattr(launch_settings, n) for n in names}
    total = sum(len(list(itertools.product(*g.values()))) for g in grids.values())
    progress = Progress(total)
    rows = []

    def sets(s: Shape, heads: int) -> list[tuple[Tensor, Tensor]]:
        shape = Shape(s.name, s.batch, heads, heads, s.seq, s.dim, s.bnhd)
        count = _buffer_sets(2 * s.batch * heads * s.seq * s.dim * dtype.itemsize)
        return [make_inputs(shape, dtype, "cuda") for _ in range(count)]

    inputs = {s.name: sets(s, s.kv_heads) for s in shapes}
    grads = {s.name: sets(s, s.heads) for s in shapes}
    try:
        for direction, grid in grids.items():
            for values in itertools.product(*grid.values()):
                setting = dict(zip(grid, values))
                for n, val in setting.items():
                    setattr(launch_settings, n, val)
                gqa_triton._expand_plan.cache_clear()
                gqa_triton._reduce_plan.cache_clear()
                for s in shapes:
                    n_rep = s.n_rep
                    calls: list[Fn]
                    if direction == "forward":
                        k, v = inputs[s.name][0]
                        out = gqa_triton.expand_forward(k, v, n_rep)
                        ok = torch.equal(out[1], v.repeat_interleave(n_rep, 1))
                        calls = [
                            functools.partial(gqa_triton.expand_forward, k, v, n_rep)
                            for k, v in inputs[s.name]
                        ]
                    else:
                        gk, gv = grads[s.name][0]
                        out = gqa_triton.reduce_backward(gk, gv, n_rep)
                        ref = gv.float().unflatten(1, (s.kv_heads, n_rep)).sum(2)
                        ok = torch.allclose(out[1].float(), ref, rtol=1e-2, atol=1e-2)
                        calls = [
                            functools.partial(gqa_triton.reduce_backward, *g, n_rep) for g in grads[s.name]
                        ]
                    ms = _graph_ms(calls)
                    rows.append({"direction": direction, "shape": s.name, **setting, "ms": ms, "correct": ok})
                    del out
                progress.step(f"{direction} {values}")
                for n, val in saved.items():
                    setattr(launch_settings, n, val)
    finally:
        for n, val in saved.items():
            setattr(launch_settings, n, val)
        gqa_triton._expand_plan.cache_clear()
        gqa_triton._reduce_plan.cache_clear()
    return {
        "machine": machine_info("cuda"),
        "ceiling_gbs": copy_ceiling_gbs("cuda"),
        "write_ceiling_gbs": write_ceiling_gbs(),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neuralops_gqa.bench", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for JSON, Markdown, PNG")
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated, e.g. bfloat16,float16,float32")
    parser.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sweep", action="store_true", help="time the launch-settings candidates instead")
    args = parser.parse_args(argv)
    device = args.device
    shapes = GPU_SHAPES if device == "cuda" else CPU_SHAPES
    if args.shapes:
        wanted = set(args.shapes.split(","))
        shapes = [s for s in shapes if s.name in wanted]
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        result = sweep(shapes, dtypes[0])
        (args.out / "sweep.json").write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}/sweep.json")
        return 0
    report = run(shapes, dtypes, device, backward=not args.no_backward)
    (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    (args.out / "bench.md").write_text(to_markdown(report))
    try:
        plot(report, args.out / "bench.png")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'neuralops-gqa[bench]')", file=sys.stderr)
    print(to_markdown(report))
    print(f"wrote {args.out}/bench.json, bench.md, bench.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

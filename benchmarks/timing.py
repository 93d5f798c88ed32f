"""How every benchmark takes time: the GPU's per call and in CUDA-graph replays, the host's
per eager call, and the limits a job is measured against (a same-size copy, the ceiling).

- ``call_ms``: events around one call after an L2 flush, median (``triton.testing.do_bench``,
  as most users time a kernel); wall clock on a CPU.
- ``graph_ms``: calls captured into one CUDA graph and replayed, rotating over input sets
  several times the L2, so neither the host nor the cache helps any provider.
- ``wall_us``: calls queued back to back, synchronised at the end, per call; candidates take
  turns in rounds (drift in the host's speed lands on all alike), median round. Where the
  host is the bottleneck this is the host's cost, elsewhere the GPU's.
- ``same_size_copies``: a copy of the same bytes two ways. A contiguous same-dtype ``copy_``
  is a ``cudaMemcpyAsync``: fast per call, but a memcpy node in a CUDA graph, which runs
  slower. The other is an SM kernel, ``torch.add(src, 0, out=dst)`` over int32 views: one
  elementwise kernel with 16-byte accesses that reads each byte once and writes it once. A
  result keeps both; the reference is the faster in each timing.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from benchmarks.cases import Shape

Fn = Callable[[], object]
COPIES = ("copy_memcpy", "copy_kernel")


@dataclass(frozen=True)
class Effort:
    """How long each measurement takes; ``QUICK`` is for smoke tests and the quick run."""

    warmup_ms: int = 25
    rep_ms: int = 100
    rounds: int = 15  # wall_us: interleaved rounds
    cpu_calls: int = 20  # call_ms on a CPU: wall-clock samples


FULL = Effort()
QUICK = Effort(5, 20, 5, 3)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def call_ms(fn: Fn, device: str, effort: Effort) -> float:
    """Median ms of one call: CUDA events around it after an L2 flush, or a CPU's wall clock."""
    if device == "cuda":
        import triton.testing

        return float(
            triton.testing.do_bench(fn, warmup=effort.warmup_ms, rep=effort.rep_ms, return_mode="median")
        )
    fn()
    times = []
    for _ in range(effort.cpu_calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def capture(calls: Sequence[Fn]) -> torch.cuda.CUDAGraph:
    """``calls`` in one CUDA graph, after running once on a side stream (which also compiles
    what needs compiling)."""
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
    return graph


def graph_ms(calls: Sequence[Fn], effort: Effort) -> float:
    """Median ms per call, ``calls`` captured into one CUDA graph and replayed (CUDA only)."""
    return call_ms(capture(calls).replay, "cuda", effort) / len(calls)


def both_ms(calls: Sequence[Fn], device: str, effort: Effort) -> dict[str, float]:
    """A provider in every timing the device has: ``call`` and, on CUDA, ``graph``."""
    times = {"call": call_ms(calls[0], device, effort)}
    if device == "cuda":
        times["graph"] = graph_ms(calls, effort)
    return times


def wall_us(candidates: Mapping[str, Fn], device: str, effort: Effort) -> dict[str, float]:
    """Microseconds per call of calls queued back to back, candidates interleaved in rounds."""
    per_round: dict[str, int] = {}
    for name, fn in candidates.items():
        fn()
        sync(device)
        start, calls = time.perf_counter(), 0
        while calls < 2 or time.perf_counter() - start < effort.warmup_ms / 1e3:
            fn()
            calls += 1
        sync(device)
        each = (time.perf_counter() - start) / calls
        per_round[name] = max(1, int(effort.rep_ms / 1e3 / effort.rounds / each))
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(effort.rounds):
        for name, fn in candidates.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(per_round[name]):
                fn()
            sync(device)
            samples[name].append((time.perf_counter() - start) / per_round[name] * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def rotation(nbytes: int, device: str) -> int:
    """Input sets for graph replays: together at least 4x the L2 (at most 8), at least 2."""
    if device != "cuda":
        return 1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(8, -(-4 * l2 // max(nbytes, 1))))


def input_sets(
    shape: Shape, dtype: torch.dtype, device: str, heads: int | None = None
) -> list[tuple[Tensor, Tensor]]:
    """Pairs of ``shape``'s tensors (``heads`` heads: the gradients' for a backward) to rotate over."""
    h = shape.kv_heads if heads is None else heads
    count = rotation(2 * shape.batch * h * shape.seq * shape.dim * dtype.itemsize, device)
    return [shape.tensors(dtype, device, h) for _ in range(count)]


def _kernel_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    torch.add(src, 0, out=dst)


def same_size_copies(nbytes: int, device: str) -> dict[str, list[Fn]]:
    """Both copies of ``nbytes`` read + written, rotating over buffers as ``rotation`` says."""
    words = max(1, nbytes // 8)  # half read, half written, in int32 words
    pairs = [
        (
            torch.zeros(words, dtype=torch.int32, device=device),
            torch.empty(words, dtype=torch.int32, device=device),
        )
        for _ in range(rotation(4 * words, device))
    ]
    return {
        "copy_memcpy": [functools.partial(dst.copy_, src) for src, dst in pairs],
        "copy_kernel": [functools.partial(_kernel_copy, src, dst) for src, dst in pairs],
    }


def ceiling_gbs(device: str, effort: Effort) -> dict[str, float]:
    """GB/s of each 1 GiB copy per call, bytes read + written: the large-copy ceiling."""
    copies = same_size_copies(2**31, device)
    return {name: 2**31 / call_ms(calls[0], device, effort) / 1e6 for name, calls in copies.items()}

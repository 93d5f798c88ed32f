"""The kernel tables: every provider's time per shape, dtype and direction beside a copy of
the same bytes, per call and in CUDA-graph replays; and the launch-settings sweep.

Forward: k and v expanded; backward: both gradients reduced (the backward's kernel work).
A row keeps raw times (``call_ms``, ``graph_ms``: provider -> ms); percents and speedups
are the report's to compute. Not for: host cost (:mod:`benchmarks.host`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, replace
from typing import Any

import torch

from benchmarks import peers, timing
from benchmarks.cases import SWEEPS, Shape
from benchmarks.results import Report, Step


def _case_steps(report: Report, dtype: str, shape: Shape, direction: str, device: str, effort: timing.Effort,
                compiled_peers: bool, backend: str) -> list[Step]:  # fmt: skip
    torch_dtype, forward = getattr(torch, dtype), direction == "forward"
    row: dict[str, Any] = {"shape": asdict(shape), "dtype": dtype, "direction": direction}
    row["bytes"] = shape.minimal_bytes(torch_dtype.itemsize)
    providers: dict[str, Any] = (
        peers.forward_peers(shape.kv_heads, device, compiled_peers, backend)
        if forward
        else peers.backward_peers(device, compiled_peers, backend)
    )

    def measure(provider: str, fn: Any) -> None:
        if fn is None:
            calls = timing.same_size_copies(row["bytes"], device)
        else:
            sets = timing.input_sets(shape, torch_dtype, device, None if forward else shape.heads)
            calls = {provider: [functools.partial(fn, a, b, shape.n_rep) for a, b in sets]}
        if not any(r is row for r in report["results"]):
            report["results"].append(row)
        for name, each in calls.items():
            for kind, ms in timing.both_ms(each, device, effort).items():
                row.setdefault(f"{kind}_ms", {})[name] = ms
        if device == "cuda":
            torch.cuda.empty_cache()

    label = f"kernels {dtype} {shape.name} {direction}"
    return [
        (f"{label} {p}", functools.partial(measure, p, fn))
        for p, fn in {**providers, "same_size_copy": None}.items()
    ]


def steps(report: Report, shapes: list[Shape], dtypes: list[str], device: str, effort: timing.Effort,
          backward: bool = True, compiled_peers: bool = True, backend: str = "inductor") -> list[Step]:  # fmt: skip
    """A step per provider and case; on CUDA first the ceiling (1 GiB copies)."""
    report.setdefault("results", [])
    out: list[Step] = []
    if device == "cuda":
        out.append(("kernels: copy ceiling", lambda: _ceiling(report, effort)))
    for dtype, shape, direction in itertools.product(dtypes, shapes, ("forward", "backward")[: 1 + backward]):
        out += _case_steps(report, dtype, shape, direction, device, effort, compiled_peers, backend)
    return out


def _ceiling(report: Report, effort: timing.Effort) -> None:
    report["ceiling"] = timing.ceiling_gbs("cuda", effort)
    report["ceiling_gbs"] = max(report["ceiling"].values())


def sweep_steps(report: Report, shapes: list[Shape], dtype: torch.dtype, grids: list[str],
                effort: timing.Effort) -> list[Step]:  # fmt: skip
    """Every launch-settings candidate on every shape (CUDA only), in graph replays. A
    candidate is a ``LaunchSettings`` value the launchers take; its output is checked once
    against Hugging Face's formulation, so a fast wrong variant can't win."""
    from csrc_free_ops import gqa_triton
    from csrc_free_ops.launch_settings import DEFAULT

    def measure(direction: str, setting: dict[str, int]) -> None:
        settings, forward = replace(DEFAULT, **setting), direction == "forward"
        launcher = functools.partial(
            gqa_triton.expand_forward if forward else gqa_triton.reduce_backward, settings=settings
        )
        for shape in shapes:
            sets = timing.input_sets(shape, dtype, "cuda", None if forward else shape.heads)
            got, want = (
                launcher(*sets[0], shape.n_rep),
                (peers.hf if forward else peers.hf_backward)(*sets[0], shape.n_rep),
            )
            ok = all(torch.allclose(g.float(), w.float(), rtol=1e-2, atol=1e-2) for g, w in zip(got, want))
            ms = timing.graph_ms([functools.partial(launcher, a, b, shape.n_rep) for a, b in sets], effort)
            report["rows"].append(
                {"direction": direction, "shape": shape.name, **setting, "ms": ms, "correct": ok}
            )

    out: list[Step] = [("sweep: copy ceiling", lambda: _ceiling(report, effort))]
    for grid in grids:
        direction, candidates = SWEEPS[grid]
        for values in itertools.product(*candidates.values()):
            setting = dict(zip(candidates, values))
            out.append((f"sweep {grid} {values}", functools.partial(measure, direction, setting)))
    return out

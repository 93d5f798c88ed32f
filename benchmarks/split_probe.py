"""The group reduction's work divided among programs otherwise than the kernel does, timed
against the reduction kernel and a same-size copy: ``python -m benchmarks.split_probe --out
DIR`` (CUDA only).

The kernel sums each group's ``n_rep`` gradient heads in one program per tile, as many
programs as tiles. Two alternatives are measured (``--families``):

- ``split``: each program takes ``ceil(n_rep / S)`` of a group's heads and stores its
  float32 partial sum; the ``S`` partials of a tile are then added in a fixed order, so the
  result stays deterministic: by a second launch (``2pass``), or in one launch by the last
  program of a tile to finish (``fixup``, a counter per tile, zeroed before the launch).
- ``persistent``: a balanced grid of ``P`` programs per SM, each taking an equal share of the
  output (16-byte aligned, across head planes) and looping over it; each element is summed
  by one thread in the kernel's order, so the bits are the kernel's. No program waits for a
  wave after the others: a grid of 1.2-1.9 waves, batch 1 with few KV heads, has no tail.

Gradients are contiguous, k and v stacked as one tensor of twice the batch (the programs
and bytes of the kernel's k-and-v launch). Each split is checked against the kernel (one
rounding apart) before it is timed; timings per call and in graph replays as in
``benchmarks.timing``. Writes split-probe.json; docs/benchmarks.md says what it showed.

Under Nsight Compute, ``--profile`` launches each variant once per point instead of timing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch import Tensor

from benchmarks import cases, cli, timing
from csrc_free_ops import gqa_triton

# (S, tile elements, warps): two to eight splits, tiles of 512 B to 2 KiB of bfloat16.
VARIANTS = [(s, block, warps) for s in (2, 4, 8) for block, warps in ((256, 1), (512, 2), (1024, 4))]
# (programs per SM, warps, elements per thread a step): 64 or 32 warps an SM, 8- or 16-byte vectors.
PERSISTENT_VARIANTS = [(per_sm, warps, vec) for warps, vec in ((8, 4), (4, 4), (8, 8), (16, 4))
                       for per_sm in (64 // warps, 32 // warps)]  # fmt: skip
FAMILIES = ("split", "persistent")


@triton.jit  # type: ignore[untyped-decorator]
def partial_kernel(src, ws, counters, out, plane, tiles, N_REP: tl.constexpr, S: tl.constexpr,  # type: ignore[no-untyped-def]
                   R: tl.constexpr, BLOCK: tl.constexpr, FIXUP: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    s = pid % S
    t = pid // S
    tile = t % tiles
    bh = t // tiles
    offs = tile * BLOCK + tl.arange(0, BLOCK)
    mask = offs < plane
    group = src + bh.to(tl.int64) * N_REP * plane + offs
    acc = tl.zeros((BLOCK,), tl.float32)
    for u in tl.static_range(R):
        r = s * R + u
        acc += tl.load(group + r * plane, mask=mask & (offs * 0 + r < N_REP), other=0.0,
                       eviction_policy="evict_first").to(tl.float32)  # fmt: skip
    slots = ws + t.to(tl.int64) * S * BLOCK + tl.arange(0, BLOCK)
    tl.store(slots + s * BLOCK, acc)
    if FIXUP:
        tl.debug_barrier()  # every thread's partial stored before the counter moves
        if tl.atomic_add(counters + t, 1, sem="acq_rel") == S - 1:
            total = tl.zeros((BLOCK,), tl.float32)
            for j in tl.static_range(S):
                total += tl.load(slots + j * BLOCK, cache_modifier=".cg")
            tl.store(out + bh.to(tl.int64) * plane + offs, total.to(out.dtype.element_ty), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def combine_kernel(ws, out, plane, tiles, S: tl.constexpr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    t = tl.program_id(0)
    offs = (t % tiles) * BLOCK + tl.arange(0, BLOCK)
    slots = ws + t.to(tl.int64) * S * BLOCK + tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(S):
        total += tl.load(slots + j * BLOCK, eviction_policy="evict_first")
    tl.store(
        out + (t // tiles).to(tl.int64) * plane + offs, total.to(out.dtype.element_ty), mask=offs < plane
    )


@triton.jit  # type: ignore[untyped-decorator]
def persistent_kernel(src, out, plane, total, chunk, steps, N_REP: tl.constexpr,  # type: ignore[no-untyped-def]
                      BLOCK: tl.constexpr, VEC: tl.constexpr):  # fmt: skip
    start = tl.multiple_of(tl.program_id(0).to(tl.int64) * chunk, VEC)
    end = tl.minimum(start + chunk, total)
    for i in tl.range(0, steps):
        offs = start + i * BLOCK + tl.arange(0, BLOCK)
        mask = offs < end
        # Output element o of head plane bh reads input o + bh * (n_rep - 1) * plane + r * plane.
        # Planes and shares are multiples of VEC elements, so each VEC-run stays in one plane.
        src_offs = tl.max_contiguous(tl.multiple_of(offs + (offs // plane) * ((N_REP - 1) * plane), VEC), VEC)
        offs = tl.max_contiguous(tl.multiple_of(offs, VEC), VEC)
        acc = tl.zeros((BLOCK,), tl.float32)
        for r in tl.static_range(N_REP):
            acc += tl.load(src + src_offs + r * plane, mask=mask, eviction_policy="evict_first").to(
                tl.float32
            )
        tl.store(out + offs, gqa_triton._to_output(acc, out.dtype.element_ty), mask=mask)


def persistent_reduction(
    grad: Tensor, n_rep: int, sms: int, per_sm: int, warps: int, vec: int
) -> Callable[[], Tensor]:
    """A call that reduces contiguous ``grad`` over groups of ``n_rep`` heads on ``sms * per_sm`` programs."""
    batch, heads, seq, dim = grad.shape
    kv_heads, plane = heads // n_rep, seq * dim
    if plane % vec:
        raise ValueError(f"a head plane of {plane} elements is not a multiple of {vec}")
    total = batch * kv_heads * plane
    chunk = triton.cdiv(triton.cdiv(total, sms * per_sm), vec) * vec
    block = warps * 32 * vec
    grid = (triton.cdiv(total, chunk),)

    def run() -> Tensor:
        out = grad.new_empty(batch, kv_heads, seq, dim)
        persistent_kernel[grid](grad, out, plane, total, chunk, triton.cdiv(chunk, block), N_REP=n_rep,
                                BLOCK=block, VEC=vec, num_warps=warps)  # fmt: skip
        return out

    return run


def split_reduction(
    grad: Tensor, n_rep: int, splits: int, block: int, warps: int, fixup: bool
) -> Callable[[], Tensor]:
    """A call that reduces contiguous ``grad`` ``[B, H, N, D]`` over groups of ``n_rep`` heads, split ``splits`` ways."""
    batch, heads, seq, dim = grad.shape
    kv_heads, plane = heads // n_rep, seq * dim
    tiles = triton.cdiv(plane, block)
    groups = batch * kv_heads * tiles
    reps = triton.cdiv(n_rep, splits)

    def run() -> Tensor:
        out = grad.new_empty(batch, kv_heads, seq, dim)
        ws = torch.empty(groups * splits * block, dtype=torch.float32, device=grad.device)
        counters = torch.zeros(groups, dtype=torch.int32, device=grad.device) if fixup else ws
        partial_kernel[(groups * splits,)](grad, ws, counters, out, plane, tiles, N_REP=n_rep, S=splits, R=reps,
                                           BLOCK=block, FIXUP=fixup, num_warps=warps)  # fmt: skip
        if not fixup:
            combine_kernel[(groups,)](ws, out, plane, tiles, S=splits, BLOCK=block, num_warps=warps)
        return out

    return run


def _candidates(
    shape: cases.Shape, sets: list[Tensor], families: tuple[str, ...]
) -> dict[str, list[Callable[[], object]]]:
    n_rep = shape.n_rep
    found: dict[str, list[Callable[[], object]]] = {
        "kernel": [functools.partial(gqa_triton.reduce_launch(g, None, n_rep), g, None) for g in sets]
    }
    bits = found["kernel"][0]()[0]  # type: ignore[index]
    expected = bits.float()
    sms = torch.cuda.get_device_properties(sets[0].device).multi_processor_count
    for per_sm, warps, vec in PERSISTENT_VARIANTS if "persistent" in families else ():
        runs = [persistent_reduction(g, n_rep, sms, per_sm, warps, vec) for g in sets]
        if not torch.equal(runs[0](), bits):
            raise AssertionError(f"{shape.name}: the persistent reduction's bits differ from the kernel's")
        found[f"P{per_sm} w{warps} v{vec}"] = list(runs)
    for splits, block, warps in VARIANTS if "split" in families else ():
        if splits > n_rep:
            continue
        for fixup in (False, True):
            runs = [split_reduction(g, n_rep, splits, block, warps, fixup) for g in sets]
            # The float32 sums differ in order only: one bfloat16 rounding apart (atol: sums that
            # cancel to near zero, where an order's float32 error is no longer small beside them).
            torch.testing.assert_close(runs[0]().float(), expected, rtol=2**-7, atol=1e-3)
            found[f"S{splits} {block * 2} B {'fixup' if fixup else '2pass'}"] = list(runs)
    return found


def _percent(copy: dict[str, float], us: dict[str, float]) -> str:
    return " / ".join(f"{100 * copy[kind] / us[kind]:.1f}" for kind in copy)


FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for split-probe.json"),
    ("--families", cli.names(FAMILIES, "family"), "split", "split, persistent"),
    (
        "--points",
        cli.names((s.name for s in cases.SPLIT_PROBE_POINTS), "point"),
        None,
        "listed below (default: all)",
    ),
    ("--profile", bool, False, "launch each variant once per point, for Nsight Compute, and time nothing"),
]


def main(argv: list[str] | None = None) -> None:
    points = "\n".join(f"  {s.name:<24} {s.describe()}" for s in cases.SPLIT_PROBE_POINTS)
    parser = cli.parser(
        "python -m benchmarks.split_probe", __doc__ or "", FLAGS, "points (bfloat16):\n" + points
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "python -m benchmarks.split_probe: launches CUDA kernels; there is no GPU here", file=sys.stderr
        )
        raise SystemExit(2)
    cli.check_out(parser, args.out)
    effort = timing.Effort(10, 60, 5, 3)
    rows = []
    for shape in cases.SPLIT_PROBE_POINTS:
        if args.points and shape.name not in args.points:
            continue
        stacked = dataclasses.replace(shape, batch=2 * shape.batch)
        count = 1 if args.profile else timing.rotation(shape.minimal_bytes(2), "cuda")
        sets = [stacked.tensors(torch.bfloat16, "cuda", shape.heads)[0] for _ in range(count)]
        found = _candidates(shape, sets, tuple(args.families))
        if args.profile:
            for runs in found.values():
                runs[0]()
            torch.cuda.synchronize()
            print(f"{shape.name}: {', '.join(found)}", flush=True)
            continue
        copies = timing.same_size_copies(shape.minimal_bytes(2), "cuda")  # k and v's bytes
        found.update(copies)
        us = {name: {kind: ms * 1e3 for kind, ms in timing.both_ms(runs, "cuda", effort).items()}
              for name, runs in found.items()}  # fmt: skip
        rows.append({"point": shape.name, "us": us})
        copy = {kind: min(us[name][kind] for name in timing.COPIES) for kind in ("call", "graph")}
        line = (
            f"{shape.name}: % of the copy per call / in graph replays: kernel {_percent(copy, us['kernel'])}"
        )
        for family, prefix in zip(FAMILIES, "SP"):
            named = [name for name in us if name.startswith(prefix)]
            if named:
                best = min(named, key=lambda name: us[name]["call"])
                line += f"; best {family} ({best}) {_percent(copy, us[best])}"
        print(line, flush=True)
    if not args.profile:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "split-probe.json"
        device = torch.cuda.get_device_name()
        path.write_text(json.dumps({"device": device, "torch": torch.__version__, "triton": triton.__version__,
                                    "rows": rows}, indent=1) + "\n")  # fmt: skip
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

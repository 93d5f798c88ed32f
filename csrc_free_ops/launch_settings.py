"""Launch settings for the GQA kernels: a fixed heuristic by shape class and device, no autotuning.

Both kernels stream memory, so what matters is (1) enough bytes in flight per SM, which
wants large tiles and several 16-byte vectors per thread, and (2) enough programs to cover
the device's SMs several times over, which wants small tiles when the tensor is small. The
rules below start from a large tile and halve it until the grid is wide enough. The
expansion can also split the ``n_rep`` stores of one tile across programs (the tile is then
re-read from L2); the reduction can't without atomics, so it only shrinks tiles.

What depends on the device is read from it (``Device``): the program target is a number of
waves of its SMs, and the largest head plane that output-ordered programs may re-read is a
fraction of its L2 cache. The fractions and tile sizes were measured on an H200 (132 SMs,
60 MB L2); docs/benchmarks.md has the measurements.

Under ``torch.compile`` with dynamic shapes the batch and sequence sizes are symbols, so no
rule may depend on them (a decision on a symbol would guard on it and recompile on new
sizes): ``sizes_known=False`` keeps the tile at its full size and picks the program order
from ``n_rep`` alone.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import triton


class Device(NamedTuple):
    """What the launch settings need to know about a GPU."""

    sms: int
    l2_bytes: int


# The H200 the constants below were measured on; also the stand-in where there is no GPU
# (the Triton interpreter on a CPU), where the choice only affects speed.
REFERENCE_DEVICE = Device(sms=132, l2_bytes=60 * 2**20)


@functools.cache
def cuda_device(index: int) -> Device:
    """The SM count and L2 size of CUDA device ``index`` (read once per device)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return Device(props.multi_processor_count, props.L2_cache_size)


# Programs wanted in one launch, in waves of the device's SMs (4 x 132 = 528 on an H200).
WAVES = 4
# The reduction of long groups (MQA) splits the sequence finer: each program sums its
# group's n_rep tiles in order, so more, smaller tiles put more loads in flight and even
# out the SMs' shares; tiles shrink to LONG_GROUP_MIN_TILE_BYTES while the grid is under
# LONG_GROUP_WAVES waves.
LONG_GROUP_WAVES = 4
LONG_GROUP_MIN_TILE_BYTES = 2048
# A tile's bytes before shrinking, and the floor shrinking stops at.
TILE_BYTES = 4096
MIN_TILE_BYTES = 2048
# Tile bytes per warp: 32 threads x 16-byte vectors x 2 vectors each.
BYTES_PER_WARP = 32 * 16 * 2
MAX_WARPS = 8
# The reduction issues this many of a group's loads together per loop step.
REDUCE_UNROLL = 8
# Groups of up to this many reps (every model shape but MQA) take the "short group" settings
# below; larger groups keep the plain ones.
SHORT_GROUP_MAX_REPS = 16
# Short groups: the reduction gives each thread one 16-byte vector per load (twice the
# threads, so more loads in flight: many-short backward 87.4% -> 90.1%, Llama-3-8B 89.8% ->
# 91.4%); MQA (71 reps) loses 2 points with it (85.6% -> 83.7%).
REDUCE_SHORT_GROUP_BYTES_PER_WARP = 32 * 16
# Cache hints for short groups (0 turns them off). Expansion: the input tile is loaded
# ``evict_last`` (rep-major programs re-read it) and the outputs are stored streaming
# (``.cs``): Llama-3-70B forward 96.9% -> 98.5%, long context 91.7% -> 93.3%; MQA loses 1.5
# points with them. Reduction: loads are cached in L2 only (``.cg``) instead of marked
# ``evict_first``: long context backward 94.1% -> 97.7%, float32 Llama-3-8B 94.6% -> 97.6%;
# MQA loses 4 points with it.
CACHE_HINTS = 1
# Expansion program order: up to this many reps, and with tiles to spare, programs walk the
# output linearly (one rep of one tile each, the input re-read from L2); above it, each
# program stores a chunk of one tile's reps.
REP_MAJOR_MAX_REPS = 16
# ... and while one KV head's plane (N x D) is at most this fraction of the L2 cache: a
# larger plane is evicted before the next rep re-reads it. On the H200 (60 MiB L2, so
# 4 MiB): long context, 8 MiB planes, 87.7% of the copy ceiling output-ordered against
# 91.0% tile-ordered; Llama-3-70B, 2 MiB: 97.0% against 89.8%; Llama-3-70B in float32,
# 4 MiB, output-ordered in docs/benchmarks/h200.json, tile-ordered (a fraction of 16) in
# docs/benchmarks/h200-l2-sixteenth.json.
REP_MAJOR_L2_FRACTION = 15


class Tiling(NamedTuple):
    block_r: int
    block_c: int
    tiles_r: int
    tiles_c: int
    num_warps: int


def target_programs(device: Device) -> int:
    return WAVES * device.sms


def _tiling(
    rows: int,
    cols: int,
    itemsize: int,
    heads: int,
    per_warp: int,
    device: Device,
    sizes_known: bool,
    waves: int | None = None,
    min_tile_bytes: int | None = None,
) -> Tiling:
    target = (WAVES if waves is None else waves) * device.sms
    floor = MIN_TILE_BYTES if min_tile_bytes is None else min_tile_bytes
    tile_elems = max(1, TILE_BYTES // itemsize)
    if not sizes_known:
        # A folded head (rows == 1) is one run of unknown length: the tile takes it whole.
        # Otherwise the columns are the head dim, a model constant (int() specialises on it).
        block_c = tile_elems if rows == 1 else min(triton.next_power_of_2(int(cols)), tile_elems)
        block_r = max(1, tile_elems // block_c)
    while sizes_known:
        block_c = min(triton.next_power_of_2(cols), tile_elems)
        block_r = max(1, min(triton.next_power_of_2(rows), tile_elems // block_c))
        tiles = heads * triton.cdiv(rows, block_r) * triton.cdiv(cols, block_c)
        if tiles >= target or tile_elems * itemsize <= floor:
            break
        tile_elems //= 2
    warps = min(MAX_WARPS, max(1, block_r * block_c * itemsize // per_warp))
    return Tiling(block_r, block_c, (rows + block_r - 1) // block_r, (cols + block_c - 1) // block_c, warps)


def expand_tiling(
    rows: int, cols: int, itemsize: int, heads: int, device: Device, sizes_known: bool = True
) -> Tiling:
    """Tiling of one KV head's ``[rows, cols]`` plane for the expansion."""
    return _tiling(rows, cols, itemsize, heads, BYTES_PER_WARP, device, sizes_known)


def rep_split(
    programs: int, n_rep: int, plane_bytes: int, device: Device, sizes_known: bool = True
) -> tuple[int, int, bool]:
    """``(rep_chunks, reps_per_program, rep_major)``: how the ``n_rep`` stores of a tile are shared out.

    With tiles to spare, few reps and head planes small enough to be re-read from L2, every
    program stores one rep and programs walk the output in order (``rep_major``). Otherwise
    each program stores a chunk of a tile's reps, split further when the tiles alone give
    fewer than ``target_programs`` programs (MQA). With unknown sizes: output order for
    short groups, and every program storing all of its tile's reps for long ones.
    """
    if not sizes_known:
        return (n_rep, 1, True) if n_rep <= REP_MAJOR_MAX_REPS else (1, n_rep, False)
    target = target_programs(device)
    if (
        n_rep <= REP_MAJOR_MAX_REPS
        and programs >= target
        and plane_bytes <= device.l2_bytes // REP_MAJOR_L2_FRACTION
    ):
        return n_rep, 1, True
    chunks = min(n_rep, max(1, triton.cdiv(target, max(programs, 1))))
    reps_per_program = triton.cdiv(n_rep, chunks)
    return triton.cdiv(n_rep, reps_per_program), reps_per_program, False


def reduce_tiling(
    rows: int, cols: int, itemsize: int, heads: int, n_rep: int, device: Device, sizes_known: bool = True
) -> Tiling:
    """Tiling of one KV head's ``[rows, cols]`` plane for the group reduction."""
    if n_rep <= SHORT_GROUP_MAX_REPS:
        return _tiling(rows, cols, itemsize, heads, REDUCE_SHORT_GROUP_BYTES_PER_WARP, device, sizes_known)
    return _tiling(rows, cols, itemsize, heads, BYTES_PER_WARP, device, sizes_known,
                   LONG_GROUP_WAVES, LONG_GROUP_MIN_TILE_BYTES)  # fmt: skip


def cache_hints(n_rep: int) -> bool:
    """Whether the kernels use their short-group cache hints (see ``CACHE_HINTS``)."""
    return bool(CACHE_HINTS) and n_rep <= SHORT_GROUP_MAX_REPS

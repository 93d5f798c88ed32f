"""Launch settings for the GQA kernels: a fixed heuristic by shape class, no autotuning.

Both kernels stream memory, so what matters is (1) enough bytes in flight per SM, which
wants large tiles and several 16-byte vectors per thread, and (2) enough programs to cover
the 132 SMs of an H200 several times over, which wants small tiles when the tensor is
small. The rules below start from a large tile and halve it until the grid is wide enough.
The expansion can also split the ``n_rep`` stores of one tile across programs (the tile
is then re-read from L2); the reduction can't without atomics, so it only shrinks tiles.

The constants are chosen from measurements on an H200; docs/benchmarks.md has the sweep.
"""

from __future__ import annotations

from typing import NamedTuple

import triton

# Programs wanted in one launch: 4 waves of the H200's 132 SMs.
TARGET_PROGRAMS = 528
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
# ... and while one KV head's plane (N x D) is at most this big: a larger plane is evicted
# from L2 before the next rep re-reads it (long context, 8 MiB planes: 87.7% of the copy
# ceiling output-ordered against 91.0% tile-ordered; Llama-3-70B, 2 MiB: 97.0% against 89.8%).
REP_MAJOR_MAX_PLANE_BYTES = 4 * 2**20


class Tiling(NamedTuple):
    block_r: int
    block_c: int
    tiles_r: int
    tiles_c: int
    num_warps: int


def _tiling(rows: int, cols: int, itemsize: int, heads: int, tile_bytes: int, per_warp: int) -> Tiling:
    tile_elems = max(1, tile_bytes // itemsize)
    while True:
        block_c = min(triton.next_power_of_2(cols), tile_elems)
        block_r = max(1, min(triton.next_power_of_2(rows), tile_elems // block_c))
        tiles = heads * triton.cdiv(rows, block_r) * triton.cdiv(cols, block_c)
        if tiles >= TARGET_PROGRAMS or tile_elems * itemsize <= MIN_TILE_BYTES:
            break
        tile_elems //= 2
    warps = min(MAX_WARPS, max(1, block_r * block_c * itemsize // per_warp))
    return Tiling(block_r, block_c, triton.cdiv(rows, block_r), triton.cdiv(cols, block_c), warps)


def expand_tiling(rows: int, cols: int, itemsize: int, heads: int) -> Tiling:
    """Tiling of one KV head's ``[rows, cols]`` plane for the expansion."""
    return _tiling(rows, cols, itemsize, heads, TILE_BYTES, BYTES_PER_WARP)


def rep_split(programs: int, n_rep: int, plane_bytes: int) -> tuple[int, int, bool]:
    """``(rep_chunks, reps_per_program, rep_major)``: how the ``n_rep`` stores of a tile are shared out.

    With tiles to spare, few reps and head planes small enough to be re-read from L2, every
    program stores one rep and programs walk the output in order (``rep_major``). Otherwise
    each program stores a chunk of a tile's reps, split further when the tiles alone give
    fewer than ``TARGET_PROGRAMS`` programs (MQA).
    """
    if (
        n_rep <= REP_MAJOR_MAX_REPS
        and programs >= TARGET_PROGRAMS
        and plane_bytes <= REP_MAJOR_MAX_PLANE_BYTES
    ):
        return n_rep, 1, True
    chunks = min(n_rep, max(1, triton.cdiv(TARGET_PROGRAMS, max(programs, 1))))
    reps_per_program = triton.cdiv(n_rep, chunks)
    return triton.cdiv(n_rep, reps_per_program), reps_per_program, False


def reduce_tiling(rows: int, cols: int, itemsize: int, heads: int, n_rep: int) -> Tiling:
    """Tiling of one KV head's ``[rows, cols]`` plane for the group reduction."""
    short = n_rep <= SHORT_GROUP_MAX_REPS
    per_warp = REDUCE_SHORT_GROUP_BYTES_PER_WARP if short else BYTES_PER_WARP
    return _tiling(rows, cols, itemsize, heads, TILE_BYTES, per_warp)


def expand_hints(n_rep: int) -> dict[str, str]:
    """The expansion's cache hints: the input load's eviction policy, the stores' cache modifier."""
    if CACHE_HINTS and n_rep <= SHORT_GROUP_MAX_REPS:
        return {"LOAD_EVICT": "evict_last", "STORE_CACHE": ".cs"}
    return {"LOAD_EVICT": "", "STORE_CACHE": ""}


def reduce_hints(n_rep: int) -> dict[str, str]:
    """The reduction's load hints: cache modifier and eviction policy (PTX allows one or the other)."""
    if CACHE_HINTS and n_rep <= SHORT_GROUP_MAX_REPS:
        return {"LOAD_CACHE": ".cg", "LOAD_EVICT": ""}
    return {"LOAD_CACHE": "", "LOAD_EVICT": "evict_first"}

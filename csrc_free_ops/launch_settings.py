"""Launch settings for the GQA kernels: a fixed heuristic by shape class and device, no autotuning.

Both kernels stream memory, so what matters is (1) enough bytes in flight per SM, which
wants large tiles and several 16-byte vectors per thread, and (2) enough programs to cover
the device's SMs several times over, which wants small tiles when the tensor is small. The
rules start from a large tile and halve it until the grid is wide enough. The expansion can
also split the ``n_rep`` stores of one tile across programs (the tile is then re-read from
L2); the reduction can't without atomics, so it only shrinks tiles.

The constants are the fields of ``LaunchSettings``, a frozen value the launchers take
(``DEFAULT`` unless told otherwise): a sweep passes candidates with
``dataclasses.replace(DEFAULT, ...)``, and a misspelt field is a ``TypeError``. What
depends on the device is read from it (``Device``): the program target is a number of waves
of its SMs, and the largest head plane that output-ordered programs may re-read is a
fraction of its L2. docs/design.md gives the measurements behind each default.

Under ``torch.compile`` with dynamic shapes the batch and sequence sizes are symbols, so no
rule may depend on them (a decision on a symbol would guard on it and recompile on new
sizes): ``sizes_known=False`` keeps the tile at its full size and picks the program order
from ``n_rep`` alone.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import triton


class Device(NamedTuple):
    """What the launch settings need to know about a GPU."""

    sms: int
    l2_bytes: int


# The H200 the defaults were measured on; also the stand-in where there is no GPU (the
# Triton interpreter on a CPU), where the choice only affects speed.
REFERENCE_DEVICE = Device(sms=132, l2_bytes=60 * 2**20)


@functools.cache
def cuda_device(index: int) -> Device:
    """The SM count and L2 size of CUDA device ``index`` (read once per device)."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return Device(props.multi_processor_count, props.L2_cache_size)


class Tiling(NamedTuple):
    block_r: int
    block_c: int
    tiles_r: int
    tiles_c: int
    num_warps: int


@dataclass(frozen=True)
class LaunchSettings:
    """The heuristic's constants. Field names are upper case: they are what docs/design.md
    and the sweep's results call them."""

    # Programs wanted in one launch, in waves of the device's SMs.
    WAVES: int = 4
    # A tile's bytes before shrinking, and the floor shrinking stops at.
    TILE_BYTES: int = 4096
    MIN_TILE_BYTES: int = 2048
    # Tile bytes per warp: 32 threads x 16-byte vectors x 2 vectors each.
    BYTES_PER_WARP: int = 32 * 16 * 2
    MAX_WARPS: int = 16
    # The reduction issues this many of a group's loads together per loop step.
    REDUCE_UNROLL: int = 8
    # Groups of up to this many reps (every GQA model; MQA has more) take the "short group"
    # settings below.
    SHORT_GROUP_MAX_REPS: int = 16
    # Short groups: the reduction gives each thread one 8-byte vector per load (twice the
    # threads of 16-byte vectors, so more loads in flight where batch 1 and few KV heads
    # leave few tiles; a 4 KiB tile then runs 16 warps); long groups lose with it.
    REDUCE_SHORT_GROUP_BYTES_PER_WARP: int = 32 * 8
    # Long groups (MQA): each program sums its group's n_rep tiles in order, so finer tiles
    # put more loads in flight and even out the SMs' shares; tiles shrink down to
    # LONG_GROUP_MIN_TILE_BYTES while the grid is under LONG_GROUP_WAVES waves.
    LONG_GROUP_WAVES: int = 16
    LONG_GROUP_MIN_TILE_BYTES: int = 512
    # Long groups' tile bytes per warp (BYTES_PER_WARP's two vectors per thread).
    LONG_GROUP_BYTES_PER_WARP: int = 32 * 16 * 2
    # Cache hints for short groups (0 turns them off): the expansion loads its input tile
    # evict_last (rep-major programs re-read it) and stores streaming (.cs); the reduction
    # loads through L2 only (.cg) instead of evict_first. Long groups lose with them.
    CACHE_HINTS: int = 1
    # The reduction's short-group load hint (.cg instead of evict_first) only for jobs that
    # read and write at least this many L2s: it gains 1-3% there and loses up to 10% on
    # smaller jobs timed one call at a time (batch 1, few KV heads). With unknown sizes: off.
    REDUCE_CACHE_HINTS_MIN_L2S: int = 4
    # Expansion program order: up to this many reps, with tiles to spare, programs walk the
    # output linearly (one rep of one tile each, the input re-read from L2)... Long groups of
    # up to 32 (Falcon-180B's 29) gain with it too: a tile-major program storing 29 copies
    # of its tile lagged a same-size copy by 5% at 738 MB.
    REP_MAJOR_MAX_REPS: int = 32
    # ... while one KV head's plane is at most this fraction of the L2: a larger plane is
    # evicted before the next rep re-reads it...
    REP_MAJOR_L2_FRACTION: int = 15
    # ... and while the job writes at least this many L2s: output order pays where the writes
    # must stream to memory during the kernel; below, the L2 absorbs tile-ordered writes and
    # re-reading the input costs more than it saves.
    REP_MAJOR_MIN_OUTPUT_L2S: int = 3

    def target_programs(self, device: Device) -> int:
        return self.WAVES * device.sms

    def _tiling(
        self,
        rows: int,
        cols: int,
        itemsize: int,
        heads: int,
        per_warp: int,
        device: Device,
        sizes_known: bool,
        waves: int,
        min_tile_bytes: int,
    ) -> Tiling:
        target = waves * device.sms
        tile_elems = max(1, self.TILE_BYTES // itemsize)
        if not sizes_known:
            # A folded head (rows == 1) is one run of unknown length: the tile takes it whole.
            # Otherwise the columns are the head dim, a model constant (int() specialises on it).
            block_c = tile_elems if rows == 1 else min(triton.next_power_of_2(int(cols)), tile_elems)
            block_r = max(1, tile_elems // block_c)
        while sizes_known:
            block_c = min(triton.next_power_of_2(cols), tile_elems)
            block_r = max(1, min(triton.next_power_of_2(rows), tile_elems // block_c))
            tiles = heads * triton.cdiv(rows, block_r) * triton.cdiv(cols, block_c)
            if tiles >= target or tile_elems * itemsize <= min_tile_bytes:
                break
            tile_elems //= 2
        warps = min(self.MAX_WARPS, max(1, block_r * block_c * itemsize // per_warp))
        return Tiling(
            block_r, block_c, (rows + block_r - 1) // block_r, (cols + block_c - 1) // block_c, warps
        )

    def expand_tiling(
        self, rows: int, cols: int, itemsize: int, heads: int, device: Device, sizes_known: bool = True
    ) -> Tiling:
        """Tiling of one KV head's ``[rows, cols]`` plane for the expansion."""
        return self._tiling(rows, cols, itemsize, heads, self.BYTES_PER_WARP, device, sizes_known,
                            self.WAVES, self.MIN_TILE_BYTES)  # fmt: skip

    def rep_split(
        self,
        programs: int,
        n_rep: int,
        plane_bytes: int,
        device: Device,
        sizes_known: bool = True,
        out_bytes: int = 0,
    ) -> tuple[int, int, bool]:
        """``(rep_chunks, reps_per_program, rep_major)``: how the ``n_rep`` stores of a tile are shared out.

        With tiles to spare, few reps, head planes small enough to be re-read from L2 and an
        output of several L2s (``out_bytes``, both tensors), every program stores one rep and
        programs walk the output in order (``rep_major``).
        Otherwise each program stores a chunk of a tile's reps, split further when the tiles
        alone give fewer than ``target_programs`` programs (MQA). With unknown sizes: output
        order for short groups, and every program storing all of its tile's reps for long ones.
        """
        if not sizes_known:
            return (n_rep, 1, True) if n_rep <= self.REP_MAJOR_MAX_REPS else (1, n_rep, False)
        target = self.target_programs(device)
        if (
            n_rep <= self.REP_MAJOR_MAX_REPS
            and programs >= target
            and plane_bytes <= device.l2_bytes // self.REP_MAJOR_L2_FRACTION
            and out_bytes >= self.REP_MAJOR_MIN_OUTPUT_L2S * device.l2_bytes
        ):
            return n_rep, 1, True
        chunks = min(n_rep, max(1, triton.cdiv(target, max(programs, 1))))
        reps_per_program = triton.cdiv(n_rep, chunks)
        return triton.cdiv(n_rep, reps_per_program), reps_per_program, False

    def reduce_tiling(
        self,
        rows: int,
        cols: int,
        itemsize: int,
        heads: int,
        n_rep: int,
        device: Device,
        sizes_known: bool = True,
    ) -> Tiling:
        """Tiling of one KV head's ``[rows, cols]`` plane for the group reduction."""
        if n_rep <= self.SHORT_GROUP_MAX_REPS:
            return self._tiling(rows, cols, itemsize, heads, self.REDUCE_SHORT_GROUP_BYTES_PER_WARP, device,
                                sizes_known, self.WAVES, self.MIN_TILE_BYTES)  # fmt: skip
        return self._tiling(rows, cols, itemsize, heads, self.LONG_GROUP_BYTES_PER_WARP, device, sizes_known,
                            self.LONG_GROUP_WAVES, self.LONG_GROUP_MIN_TILE_BYTES)  # fmt: skip

    def reduce_unroll(self, n_rep: int) -> int:
        return min(n_rep, self.REDUCE_UNROLL)

    def cache_hints(self, n_rep: int) -> bool:
        """Whether the expansion uses its short-group cache hints (see ``CACHE_HINTS``)."""
        return bool(self.CACHE_HINTS) and n_rep <= self.SHORT_GROUP_MAX_REPS

    def reduce_cache_hints(
        self, n_rep: int, job_bytes: int, device: Device, sizes_known: bool = True
    ) -> bool:
        """Whether the reduction uses its short-group load hint (see ``REDUCE_CACHE_HINTS_MIN_L2S``)."""
        return (
            sizes_known
            and self.cache_hints(n_rep)
            and job_bytes >= self.REDUCE_CACHE_HINTS_MIN_L2S * device.l2_bytes
        )


DEFAULT = LaunchSettings()
"""The settings every launch uses unless a caller (the benchmark's sweep) passes others."""

"""Triton kernels for the GQA head expansion (forward) and its group reduction (backward).

Both are memory-bound copies: the floor is the minimal bytes over the copy bandwidth. So
each kernel touches every byte once:

- ``expand_fwd_kernel`` loads a tile of one KV head once and stores it ``n_rep`` times;
  k and v share one launch.
- ``reduce_bwd_kernel`` loads the ``n_rep`` gradient tiles of one group, sums them in
  float32 (float64 for float64) in a fixed order, stores once; both gradients share one
  launch. No atomics, so results are deterministic.

Inputs keep their strides (no ``.contiguous()``): the launcher folds ``(N, D)`` into one
dimension when the rows are packed, so the common case is a long 1-D run per head, and a
transposed ``[B, N, H, D]`` view becomes a 2-D ``[rows, cols]`` tile with a row stride.
The expansion's results are contiguous; the reduction's are contiguous, or laid out with
the strides its launch is given (rows dense). Offsets switch to 64-bit only when a tensor's
reach needs it.

Two ways in: ``expand_forward``/``reduce_backward`` launch now (eager calls), and with
``traced=True`` they launch through ``torch.library.wrap_triton``, which is how
``gqa_reduce``'s body reaches ``torch.compile``/AOTInductor on CUDA with the Triton backend
(``gqa_expand``'s body is the ATen form, which Inductor fuses; docs/design.md says why):
Inductor then sees the kernel launch and generates it itself, with the sizes as symbols
where they are dynamic.

This module launches; it does not validate (``neuralops_gqa.validation`` does, once, for the
fake and real implementations alike) and registers nothing with ``torch.library``.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from csrc_free_ops import launch_settings, private_internals
from csrc_free_ops.launch_settings import DEFAULT, Device, LaunchSettings, Tiling

_INT32_LIMIT = 2**31 - 1

# Element types Triton moves as themselves. Every other dtype (bool, whose loads Triton
# normalises to 0/1; the float8 and float4 types, whose pointers need a recent GPU or don't
# exist; bits8/bits16; unsigned 16-64 bit) travels as the signed integer of its width: a
# copy of the bits is a copy of the values, NaN payloads and -0.0 included.
_NATIVE_DTYPES = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16,
     torch.int32, torch.int64, torch.uint8}
)  # fmt: skip
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# The kernels' parameters carry no type annotations on purpose: Triton reads them.
# ``tl.constexpr`` marks a compile-time constant, and a type such as ``int`` would make
# Triton pass the argument as i32 whatever its value (unannotated, a value past 2^31 goes
# as i64). So each kernel tells mypy that the untyped ``triton.jit`` and the bare
# parameters are intended; the bodies are still checked, with ``tl`` and the parameters Any.
@triton.jit  # type: ignore[untyped-decorator]
def _expand_tile(  # type: ignore[no-untyped-def]
    src,
    dst,
    t,
    n_rep,
    kv_heads,
    rows,
    cols,
    s_b,
    s_h,
    s_r,
    s_c,
    tiles_r,
    tiles_c,
    rep_chunks,
    reps_per_program,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    INDEX_64: tl.constexpr,
    REP_MAJOR: tl.constexpr,
    HINTS: tl.constexpr,
):
    if INDEX_64:
        # Every offset is built from the program index or from ``rows`` (the output head's
        # size is rows * cols): widening those two makes every product 64-bit. A product
        # of two 32-bit scalars would wrap before it is added to a 64-bit offset.
        t = t.to(tl.int64)
        rows = rows * tl.full((), 1, tl.int64)
    if REP_MAJOR:
        # Consecutive programs write consecutive output: one rep chunk of a head, tile by
        # tile; the head's input is re-read from L2 for each chunk.
        tc = t % tiles_c
        t = t // tiles_c
        tr = t % tiles_r
        t = t // tiles_r
        chunk = t % rep_chunks
        bh = t // rep_chunks
    else:
        # Consecutive programs take the rep chunks of one tile, then the next tile.
        chunk = t % rep_chunks
        t = t // rep_chunks
        tc = t % tiles_c
        t = t // tiles_c
        tr = t % tiles_r
        bh = t // tiles_r
    b = bh // kv_heads
    h = bh % kv_heads
    offs_r = tr * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tc * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r < rows)[:, None] & (offs_c < cols)[None, :]
    src_offs = b * s_b + h * s_h + offs_r[:, None] * s_r + offs_c[None, :] * s_c
    if HINTS:
        tile = tl.load(src + src_offs, mask=mask, eviction_policy="evict_last")
    else:
        tile = tl.load(src + src_offs, mask=mask)
    head_elems = rows * cols
    dst_offs = offs_r[:, None] * cols + offs_c[None, :]
    first = chunk * reps_per_program
    last = tl.minimum(first + reps_per_program, n_rep)
    for r in range(first, last):
        out = dst + (bh * n_rep + r) * head_elems + dst_offs
        if HINTS:
            tl.store(out, tile, mask=mask, cache_modifier=".cs")
        else:
            tl.store(out, tile, mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def expand_fwd_kernel(  # type: ignore[no-untyped-def]
    k,
    v,
    k_out,
    v_out,
    n_rep,
    kv_heads,
    k_rows,
    k_cols,
    k_sb,
    k_sh,
    k_sr,
    k_sc,
    k_tiles_r,
    k_tiles_c,
    v_rows,
    v_cols,
    v_sb,
    v_sh,
    v_sr,
    v_sc,
    v_tiles_r,
    v_tiles_c,
    rep_chunks,
    reps_per_program,
    k_programs,
    K_BLOCK_R: tl.constexpr,
    K_BLOCK_C: tl.constexpr,
    V_BLOCK_R: tl.constexpr,
    V_BLOCK_C: tl.constexpr,
    INDEX_64: tl.constexpr,
    REP_MAJOR: tl.constexpr,
    HINTS: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < k_programs:
        _expand_tile(k, k_out, pid, n_rep, kv_heads, k_rows, k_cols, k_sb, k_sh, k_sr, k_sc,
                     k_tiles_r, k_tiles_c, rep_chunks, reps_per_program,
                     K_BLOCK_R, K_BLOCK_C, INDEX_64, REP_MAJOR, HINTS)  # fmt: skip
    else:
        _expand_tile(v, v_out, pid - k_programs, n_rep, kv_heads, v_rows, v_cols, v_sb, v_sh,
                     v_sr, v_sc, v_tiles_r, v_tiles_c, rep_chunks, reps_per_program,
                     V_BLOCK_R, V_BLOCK_C, INDEX_64, REP_MAJOR, HINTS)  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator]
def _load_grad(ptr, mask, HINTS: tl.constexpr):  # type: ignore[no-untyped-def]
    # PTX takes a cache modifier or an eviction policy, not both.
    if HINTS:
        return tl.load(ptr, mask=mask, cache_modifier=".cg")
    else:
        return tl.load(ptr, mask=mask, eviction_policy="evict_first")


@triton.jit  # type: ignore[untyped-decorator]
def _to_output(acc, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """``acc`` (float32/float64) in ``dtype``, rounded to nearest even.

    bfloat16 is rounded here in integer arithmetic: Triton's interpreter (NumPy has no
    bfloat16) truncates a float32 -> bfloat16 conversion, whatever the rounding asked for,
    so CI's interpreted runs would differ from the GPU by one step on a third of the
    elements. NaN becomes the quiet NaN PyTorch's own conversion gives (0x7FC0).
    """
    if dtype == tl.bfloat16:
        bits = acc.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
        return tl.where(is_nan, 0x7FC0, rounded).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return acc.to(dtype)


@triton.jit  # type: ignore[untyped-decorator]
def _reduce_tile(  # type: ignore[no-untyped-def]
    src,
    dst,
    t,
    kv_heads,
    rows,
    cols,
    s_b,
    s_h,
    s_r,
    s_c,
    tiles_r,
    tiles_c,
    d_b,
    d_h,
    d_r,
    N_REP: tl.constexpr,
    UNROLL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ACC64: tl.constexpr,
    INDEX_64: tl.constexpr,
    HINTS: tl.constexpr,
):
    if INDEX_64:
        # As in the expansion: the head stride times a rep index and rows * cols are
        # products of scalars, so widen those scalars too, not only the program index.
        t = t.to(tl.int64)
        rows = rows * tl.full((), 1, tl.int64)
        s_h = s_h * tl.full((), 1, tl.int64)
    tc = t % tiles_c
    t = t // tiles_c
    tr = t % tiles_r
    bh = t // tiles_r
    b = bh // kv_heads
    j = bh % kv_heads
    offs_r = tr * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_c = tc * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_r < rows)[:, None] & (offs_c < cols)[None, :]
    group = src + b * s_b + (j * N_REP) * s_h + offs_r[:, None] * s_r + offs_c[None, :] * s_c
    if ACC64:
        acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float64)
    else:
        acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    # UNROLL loads are unrolled per step so several are in flight together; the summation
    # order is fixed (head 0, 1, ..., n_rep - 1) whatever UNROLL, the tiling or the hints.
    for r0 in range(0, N_REP - N_REP % UNROLL, UNROLL):
        for u in tl.static_range(UNROLL):
            acc += _load_grad(group + (r0 + u) * s_h, mask, HINTS).to(acc.dtype)
    for u in tl.static_range(N_REP % UNROLL):
        acc += _load_grad(group + (N_REP - N_REP % UNROLL + u) * s_h, mask, HINTS).to(acc.dtype)
    dst_offs = b * d_b + j * d_h + offs_r[:, None] * d_r + offs_c[None, :]
    tl.store(dst + dst_offs, _to_output(acc, dst.dtype.element_ty), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def reduce_bwd_kernel(  # type: ignore[no-untyped-def]
    gk,
    gv,
    gk_out,
    gv_out,
    kv_heads,
    k_rows,
    k_cols,
    k_sb,
    k_sh,
    k_sr,
    k_sc,
    k_tiles_r,
    k_tiles_c,
    k_db,
    k_dh,
    k_dr,
    v_rows,
    v_cols,
    v_sb,
    v_sh,
    v_sr,
    v_sc,
    v_tiles_r,
    v_tiles_c,
    v_db,
    v_dh,
    v_dr,
    k_programs,
    N_REP: tl.constexpr,
    UNROLL: tl.constexpr,
    K_BLOCK_R: tl.constexpr,
    K_BLOCK_C: tl.constexpr,
    V_BLOCK_R: tl.constexpr,
    V_BLOCK_C: tl.constexpr,
    K_ACC64: tl.constexpr,
    V_ACC64: tl.constexpr,
    INDEX_64: tl.constexpr,
    HINTS: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < k_programs:
        _reduce_tile(gk, gk_out, pid, kv_heads, k_rows, k_cols, k_sb, k_sh, k_sr, k_sc,
                     k_tiles_r, k_tiles_c, k_db, k_dh, k_dr, N_REP, UNROLL, K_BLOCK_R, K_BLOCK_C,
                     K_ACC64, INDEX_64, HINTS)  # fmt: skip
    else:
        _reduce_tile(gv, gv_out, pid - k_programs, kv_heads, v_rows, v_cols, v_sb, v_sh, v_sr,
                     v_sc, v_tiles_r, v_tiles_c, v_db, v_dh, v_dr, N_REP, UNROLL, V_BLOCK_R,
                     V_BLOCK_C, V_ACC64, INDEX_64, HINTS)  # fmt: skip


@triton.jit
def _probe_store_kernel(out, value):  # type: ignore[no-untyped-def]
    """Stores ``value``: how ``private_internals`` checks its direct launch path once."""
    tl.store(out, value)


def _layout(
    shape: tuple[int, ...], stride: tuple[int, ...], out_packed: bool = True
) -> tuple[int, int, int, int, int, int]:
    """``(rows, cols, s_b, s_h, s_r, s_c)``: one head as a 2-D ``[rows, cols]`` array.

    ``(N, D)`` folds into a single run when a row's stride is the row length, so packed
    heads are copied as long 1-D runs whatever D is (no masked lanes for D = 80 or 96).
    ``out_packed``: whether the result's heads are packed too (a run must be one in both).
    """
    _, _, n, d = shape
    s_b, s_h, s_n, s_d = stride
    if out_packed and d == 1:
        return 1, n, s_b, s_h, 0, s_n
    if out_packed and (n == 1 or s_n == d * s_d):
        return 1, n * d, s_b, s_h, 0, s_d
    return n, d, s_b, s_h, s_n, s_d


def _out_layout(
    layout: tuple[int, ...], heads: int, out_stride: tuple[int, ...] | None
) -> tuple[int, int, int]:
    """``(d_b, d_h, d_r)``: the result's batch, head and row strides in ``layout``'s
    ``[rows, cols]`` form; its columns are dense. ``out_stride`` None: a contiguous result."""
    rows, cols = layout[0], layout[1]
    if out_stride is None:
        return heads * rows * cols, rows * cols, cols
    return out_stride[0], out_stride[1], out_stride[2] if rows > 1 else 0


def _reach(
    shape: tuple[int, ...],
    layout: tuple[int, ...],
    tiling: Tiling,
    out_heads: int,
    out: tuple[int, int, int] | None = None,
) -> int:
    """Largest element offset a program may form, masked lanes included, input or output.

    ``out``: the result's ``(d_b, d_h, d_r)`` (``_out_layout``); None: a contiguous result."""
    b, h = shape[0], shape[1]
    _, _, s_b, s_h, s_r, s_c = layout
    padded_r = tiling.tiles_r * tiling.block_r
    padded_c = tiling.tiles_c * tiling.block_c
    src = (b - 1) * s_b + (h - 1) * s_h + (padded_r - 1) * s_r + (padded_c - 1) * s_c
    if out is None:
        return max(src, b * out_heads * padded_r * padded_c)
    d_b, d_h, d_r = out
    return max(src, (b - 1) * d_b + (out_heads - 1) * d_h + (padded_r - 1) * d_r + padded_c - 1)


def _needs_index_64(reach: int) -> bool:
    if isinstance(reach, int):
        return reach > _INT32_LIMIT
    # A symbolic size (torch.compile with dynamic shapes): 32-bit offsets only where the
    # bound is known without a guard, so no size makes the compiled kernel wrap.
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return not statically_known_true(reach <= _INT32_LIMIT)


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels as (itself, or the integer of its width)."""
    return dtype if dtype in _NATIVE_DTYPES else _INT_OF_WIDTH[dtype.itemsize]


def _as_copyable(x: Tensor) -> Tensor:
    return x if x.dtype in _NATIVE_DTYPES else x.view(_INT_OF_WIDTH[x.element_size()])


# Stand-ins for a tensor with no elements: its branch of the kernel gets no programs.
_EMPTY_LAYOUT = (0, 0, 0, 0, 0, 0)
_EMPTY_TILING = Tiling(1, 1, 0, 0, 1)


class Plan:
    """One launch's grid, scalar arguments and meta-parameters."""

    __slots__ = ("args", "grid", "meta")

    def __init__(self, grid: tuple[int], args: tuple[int, ...], meta: dict[str, object]) -> None:
        self.grid, self.args, self.meta = grid, args, meta


def _is_concrete(*dims: object) -> bool:
    return all(isinstance(d, int) for d in dims)


def _tensor_part(
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    itemsize: int,
    heads: int,
    tiling_for: Callable[..., Tiling],
    out_packed: bool = True,
) -> tuple[tuple[int, int, int, int, int, int], Tiling, int]:
    """One tensor's layout, tiling and program count (0 when it has no elements)."""
    if _is_concrete(*shape) and math.prod(shape) == 0:
        return _EMPTY_LAYOUT, _EMPTY_TILING, 0
    layout = _layout(shape, stride, out_packed)
    tiling = tiling_for(layout[0], layout[1], itemsize, heads)
    return layout, tiling, heads * tiling.tiles_r * tiling.tiles_c


def _plan_parts(
    shapes: tuple[tuple[int, ...], tuple[int, ...]],
    strides: tuple[tuple[int, ...], tuple[int, ...]],
    itemsizes: tuple[int, int],
    heads: int,
    out_heads: int,
    tiling_for: Callable[..., Tiling],
    args: list[int],
    meta: dict[str, object],
    out_strides: tuple[tuple[int, ...] | None, tuple[int, ...] | None] | None = None,
) -> list[int]:
    """Append both tensors' scalar arguments and block sizes; set the shared meta-parameters.

    ``out_strides``: the reduction's, each result's strides (None: contiguous); each
    tensor's arguments then end with its result's ``_out_layout``. None: the expansion's,
    whose results are contiguous and placed by the kernel itself.
    Returns the two program counts (the caller decides the grid).
    """
    outs = (None, None) if out_strides is None else out_strides
    packed = [o is None or shape[2] == 1 or o[2] == shape[3] for shape, o in zip(shapes, outs)]
    parts = [_tensor_part(*t, heads, tiling_for, p) for t, p in zip(zip(shapes, strides, itemsizes), packed)]
    places: list[tuple[int, int, int] | None] = []
    for name, (layout, tiling, _), out in zip("KV", parts, outs):
        args += [*layout, tiling.tiles_r, tiling.tiles_c]
        place = None
        if out_strides is not None:
            place = _out_layout(layout, out_heads, out)
            args += place
        places.append(None if out is None else place)
        meta[f"{name}_BLOCK_R"], meta[f"{name}_BLOCK_C"] = tiling.block_r, tiling.block_c
    live = [(shape, layout, tiling, place) for shape, (layout, tiling, programs), place in zip(shapes, parts, places)
            if not _is_concrete(programs) or programs]  # fmt: skip
    meta["INDEX_64"] = any(
        _needs_index_64(_reach(shape, layout, tiling, out_heads, place))
        for shape, layout, tiling, place in live
    )
    meta["num_warps"] = max((tiling.num_warps for _, _, tiling, _ in live), default=1)
    return [programs for _, _, programs in parts]


def _expand_plan(
    k_shape: tuple[int, ...],
    k_stride: tuple[int, ...],
    k_itemsize: int,
    v_shape: tuple[int, ...],
    v_stride: tuple[int, ...],
    v_itemsize: int,
    n_rep: int,
    device: Device,
    settings: LaunchSettings = DEFAULT,
    sizes_known: bool | None = None,
) -> Plan | None:
    """Grid, scalar arguments and meta-parameters of one expansion; ``None``: nothing to copy.

    ``sizes_known``: whether the rules may look at batch and sequence sizes; by default,
    whether they are plain ints (not symbols of a dynamic-shape trace).
    """
    known = _is_concrete(*k_shape, *v_shape) if sizes_known is None else sizes_known
    kv_heads = k_shape[1]
    args: list[int] = [n_rep, kv_heads]
    meta: dict[str, object] = {"HINTS": settings.cache_hints(n_rep)}
    tiling = functools.partial(settings.expand_tiling, device=device, sizes_known=known)
    programs = _plan_parts((k_shape, v_shape), (k_stride, v_stride), (k_itemsize, v_itemsize),
                           k_shape[0] * kv_heads, kv_heads * n_rep, tiling, args, meta)  # fmt: skip
    if known and not any(programs):
        return None
    plane_bytes = out_bytes = 0
    if known:
        live = [(shape, itemsize) for shape, itemsize, count in
                zip((k_shape, v_shape), (k_itemsize, v_itemsize), programs) if count]  # fmt: skip
        plane_bytes = max(shape[2] * shape[3] * itemsize for shape, itemsize in live)
        out_bytes = sum(math.prod(shape) * n_rep * itemsize for shape, itemsize in live)
    rep_chunks, reps_per_program, meta["REP_MAJOR"] = settings.rep_split(
        sum(programs), n_rep, plane_bytes, device, sizes_known=known, out_bytes=out_bytes
    )
    k_programs, v_programs = (count * rep_chunks for count in programs)
    args += [rep_chunks, reps_per_program, k_programs]
    return Plan((k_programs + v_programs,), tuple(args), meta)


_ACC64 = {torch.float64}


def _job_bytes(
    k_shape: tuple[int, ...], k_dtype: torch.dtype, v_shape: tuple[int, ...], v_dtype: torch.dtype, n_rep: int
) -> int:
    """Bytes a reduction reads and writes (both gradients)."""
    return (
        (math.prod(k_shape) * k_dtype.itemsize + math.prod(v_shape) * v_dtype.itemsize) * (n_rep + 1) // n_rep
    )


def _reduce_plan(
    k_shape: tuple[int, ...],
    k_stride: tuple[int, ...],
    k_dtype: torch.dtype,
    v_shape: tuple[int, ...],
    v_stride: tuple[int, ...],
    v_dtype: torch.dtype,
    n_rep: int,
    device: Device,
    settings: LaunchSettings = DEFAULT,
    sizes_known: bool | None = None,
    out_strides: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None),
) -> Plan | None:
    """Grid, scalar arguments and meta-parameters of one reduction; ``None``: nothing to sum.

    ``out_strides``: each result's strides, its last dim dense; None: contiguous."""
    known = _is_concrete(*k_shape, *v_shape) if sizes_known is None else sizes_known
    kv_heads = k_shape[1] // n_rep
    args: list[int] = [kv_heads]
    meta: dict[str, object] = {
        "N_REP": n_rep,
        "UNROLL": settings.reduce_unroll(n_rep),
        "K_ACC64": k_dtype in _ACC64,
        "V_ACC64": v_dtype in _ACC64,
        "HINTS": known
        and settings.reduce_cache_hints(n_rep, _job_bytes(k_shape, k_dtype, v_shape, v_dtype, n_rep), device),
    }
    tiling = functools.partial(settings.reduce_tiling, n_rep=n_rep, device=device, sizes_known=known)
    programs = _plan_parts((k_shape, v_shape), (k_stride, v_stride), (k_dtype.itemsize, v_dtype.itemsize),
                           k_shape[0] * kv_heads, kv_heads, tiling, args, meta, out_strides)  # fmt: skip
    if known and not any(programs):
        return None
    args.append(programs[0])
    return Plan((programs[0] + programs[1],), tuple(args), meta)


def _device_props(device: torch.device) -> Device:
    return (
        launch_settings.cuda_device(device.index)
        if device.type == "cuda"
        else launch_settings.REFERENCE_DEVICE
    )


# Triton's interpreter keeps per-launch state in module globals: two threads interpreting
# kernels at once break each other. Interpreted launches (CPU tensors) take turns.
_INTERPRETER_LOCK = threading.Lock()


class Launch:
    """An eager launch for one argument layout: allocate the results, launch the kernel.

    Built once per layout (shapes, strides, dtypes, device) and cached (``expand_launch``,
    ``reduce_launch``), so a call plans nothing. Once a kernel has been compiled for the
    inputs' 16-byte alignments, later calls launch Triton's compiled handle directly with
    the tensors' addresses (``private_internals``): ``kernel[grid](...)`` binds every
    argument in Python and asks the driver about each pointer, most of a small call's host
    time. Triton specialises a kernel on its pointers' dtypes and alignment; the results
    come fresh from the caching allocator (aligned), so the inputs' alignments key it.
    """

    __slots__ = ("_cuda", "_device", "_kernel", "_plan", "_runs", "_shapes", "_strides")

    def __init__(
        self,
        kernel: Any,
        plan: Plan | None,
        shapes: tuple[tuple[int, ...], tuple[int, ...]],
        device: torch.device,
        strides: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None),
    ) -> None:
        self._kernel, self._plan, self._shapes, self._device = kernel, plan, shapes, device
        self._strides = strides
        self._cuda = device.type == "cuda"
        self._runs: dict[tuple[bool, bool], Callable[..., bool]] = {}

    def __call__(self, a: Tensor, b: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The results for ``a`` and ``b``; ``b`` None: one tensor, and no second result."""
        # The results take their input's dtype and device (new_empty: the cheapest allocation;
        # sizes as separate ints parse faster than one tuple), contiguous unless ``strides``.
        shapes, strides = self._shapes, self._strides
        out_a = a.new_empty(*shapes[0]) if strides[0] is None else a.new_empty_strided(shapes[0], strides[0])
        if b is None:
            out_b = None
        else:
            out_b = (
                b.new_empty(*shapes[1]) if strides[1] is None else b.new_empty_strided(shapes[1], strides[1])
            )
        plan = self._plan
        if plan is None:
            return out_a, out_b
        # One tensor: the second branch has no programs, so its arguments are stand-ins.
        in_b, res_b = (a, out_a) if b is None else (b, out_b)
        if self._cuda:
            ptr_a, ptr_b = a.data_ptr(), in_b.data_ptr()
            run = self._runs.get((ptr_a % 16 == 0, ptr_b % 16 == 0))
            if run is not None and run(ptr_a, ptr_b, out_a.data_ptr(), res_b.data_ptr()):  # type: ignore[union-attr]
                return out_a, out_b
        self._launch(plan, (a, in_b, out_a, res_b))  # type: ignore[arg-type]
        return out_a, out_b

    def direct_run(self, a: Tensor, b: Tensor | None) -> Callable[..., bool] | None:
        """The direct launch kept for inputs aligned as ``a`` and ``b`` (after a first CUDA
        call; None before, or where it is off): ``run(a, b or a, out_a, out_b or out_a)``
        with the tensors' addresses, what a call costs without its allocations and checks."""
        in_b = a if b is None else b
        return self._runs.get((a.data_ptr() % 16 == 0, in_b.data_ptr() % 16 == 0))

    def _launch(self, plan: Plan, tensors: tuple[Tensor, Tensor, Tensor, Tensor]) -> None:
        """Launch through ``kernel[grid]`` (the first launch, the interpreter, or where the
        direct launch is off), and keep a direct launcher for the next calls."""
        kernel, copyable = self._kernel, tuple(_as_copyable(t) for t in tensors)
        if not self._cuda:
            with _INTERPRETER_LOCK:
                kernel[plan.grid](*copyable, *plan.args, **plan.meta)
            return
        index = self._device.index
        with torch.cuda.device(index):
            compiled = kernel[plan.grid](*copyable, *plan.args, **plan.meta)
        run = private_internals.direct_launcher(
            kernel, compiled, plan.meta, plan.grid[0], plan.args, index, _probe_store_kernel
        )
        if run is not None:
            self._runs[(tensors[0].data_ptr() % 16 == 0, tensors[1].data_ptr() % 16 == 0)] = run


@functools.lru_cache(maxsize=1024)
def _cached_launch(
    expand: bool,
    k_shape: tuple[int, ...],
    k_stride: tuple[int, ...],
    k_dtype: torch.dtype,
    v_shape: tuple[int, ...] | None,
    v_stride: tuple[int, ...] | None,
    v_dtype: torch.dtype | None,
    n_rep: int,
    device: torch.device,
    settings: LaunchSettings,
    out_strides: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None),
) -> Launch:
    """The expansion's (``expand``) or the reduction's launch for one layout; ``v_shape`` None: k alone.

    ``out_strides``: the reduction's results' strides (None: contiguous)."""
    if v_shape is None or v_stride is None or v_dtype is None:
        # The absent second tensor has no elements, so its branch gets no programs.
        v_shape, v_stride, v_dtype = (k_shape[0], k_shape[1], k_shape[2], 0), (0, 0, 0, 1), k_dtype
    props = _device_props(device)
    if expand:
        kernel, heads = expand_fwd_kernel, k_shape[1] * n_rep
        plan = _expand_plan(k_shape, k_stride, k_dtype.itemsize, v_shape, v_stride, v_dtype.itemsize, n_rep,
                            props, settings)  # fmt: skip
    else:
        kernel, heads = reduce_bwd_kernel, k_shape[1] // n_rep
        plan = _reduce_plan(k_shape, k_stride, k_dtype, v_shape, v_stride, v_dtype, n_rep, props, settings,
                            out_strides=out_strides)  # fmt: skip
    shapes = ((k_shape[0], heads, k_shape[2], k_shape[3]), (k_shape[0], heads, k_shape[2], v_shape[3]))
    return Launch(kernel, plan, shapes, device, out_strides)


def _launch_for(
    expand: bool,
    k: Tensor,
    v: Tensor | None,
    n_rep: int,
    settings: LaunchSettings,
    out_strides: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None),
) -> Launch:
    v_layout = (None, None, None) if v is None else (v.shape, v.stride(), v.dtype)
    return _cached_launch(
        expand, k.shape, k.stride(), k.dtype, *v_layout, n_rep, k.device, settings, out_strides
    )


def expand_launch(k: Tensor, v: Tensor | None, n_rep: int, settings: LaunchSettings = DEFAULT) -> Launch:
    """The eager launch that expands tensors laid out like ``k`` and ``v`` (``v`` None: k alone)."""
    return _launch_for(True, k, v, n_rep, settings)


def reduce_launch(
    grad_k: Tensor,
    grad_v: Tensor | None,
    n_rep: int,
    settings: LaunchSettings = DEFAULT,
    out_strides: tuple[tuple[int, ...] | None, tuple[int, ...] | None] = (None, None),
) -> Launch:
    """The eager launch that reduces gradients laid out like ``grad_k`` and ``grad_v`` (``grad_v``
    None: grad_k alone), into results with ``out_strides`` (each None: contiguous)."""
    return _launch_for(False, grad_k, grad_v, n_rep, settings, out_strides)


def _traced_alloc(x: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """``(result, what the kernel writes)`` in a traced launch: the kernel writes the bits
    dtype, allocated as such and viewed back, so it never writes through a view."""
    shape = (x.shape[0], heads, x.shape[2], x.shape[3])
    bits = x.new_empty(shape, dtype=_bits_dtype(x.dtype))
    return (bits if bits.dtype == x.dtype else bits.view(x.dtype)), bits


def expand_forward(
    k: Tensor, v: Tensor, n_rep: int, traced: bool = False, settings: LaunchSettings = DEFAULT
) -> tuple[Tensor, Tensor]:
    """``[B, H_kv, N, D] -> [B, H_kv * n_rep, N, D]`` for k and v in one launch.

    ``traced``: launch through ``torch.library.wrap_triton`` (sizes may be symbolic).
    ``settings``: the launch heuristic's constants (a sweep passes candidates).
    """
    if not traced:
        k_out, v_out = expand_launch(k, v, n_rep, settings)(k, v)
        assert v_out is not None
        return k_out, v_out
    k_shape, v_shape = k.shape, v.shape
    k_out, k_bits = _traced_alloc(k, k_shape[1] * n_rep)
    v_out, v_bits = _traced_alloc(v, v_shape[1] * n_rep)
    args = (k_shape, k.stride(), k.element_size(), v_shape, v.stride(), v.element_size(), n_rep,
            _device_props(k.device), settings)  # fmt: skip
    plan = _expand_plan(*args)
    if plan is not None:
        tensors = (_as_copyable(k), _as_copyable(v), k_bits, v_bits)
        torch.library.wrap_triton(expand_fwd_kernel)[plan.grid](*tensors, *plan.args, **plan.meta)
    return k_out, v_out


def _traced_sum_result(grad: Tensor, heads: int) -> Tensor:
    """A traced reduction's result. One with no elements is copied from an empty slice of its
    gradient rather than allocated: an allocation depends on nothing, so the partitioner would
    move it into the compiled forward and save it for the backward."""
    shape = (grad.shape[0], heads, grad.shape[2], grad.shape[3])
    if any(isinstance(size, int) and size == 0 for size in shape):
        return grad[:, :heads].clone(memory_format=torch.contiguous_format)
    return grad.new_empty(shape)


def reduce_backward(
    grad_k: Tensor, grad_v: Tensor, n_rep: int, traced: bool = False, settings: LaunchSettings = DEFAULT
) -> tuple[Tensor, Tensor]:
    """``[B, H, N, D] -> [B, H // n_rep, N, D]``, summing each group, both gradients in one launch."""
    if not traced:
        gk_out, gv_out = reduce_launch(grad_k, grad_v, n_rep, settings)(grad_k, grad_v)
        assert gv_out is not None
        return gk_out, gv_out
    k_shape, v_shape = grad_k.shape, grad_v.shape
    gk_out, gv_out = (_traced_sum_result(grad, k_shape[1] // n_rep) for grad in (grad_k, grad_v))
    plan = _reduce_plan(k_shape, grad_k.stride(), grad_k.dtype, v_shape, grad_v.stride(), grad_v.dtype, n_rep,
                            _device_props(grad_k.device), settings)  # fmt: skip
    if plan is not None:
        tensors = (grad_k, grad_v, gk_out, gv_out)
        torch.library.wrap_triton(reduce_bwd_kernel)[plan.grid](*tensors, *plan.args, **plan.meta)
    return gk_out, gv_out

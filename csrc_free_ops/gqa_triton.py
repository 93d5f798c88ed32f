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
Outputs are always contiguous. Offsets switch to 64-bit only when a tensor's reach needs it.

This module launches; it does not validate (``neuralops_gqa.ops`` does, once, for the fake
and real implementations alike) and registers nothing with ``torch.library``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from csrc_free_ops import launch_settings
from csrc_free_ops.launch_settings import Tiling, expand_tiling, reduce_tiling, rep_split

_INT32_LIMIT = 2**31 - 1

# Element types Triton can't move bit-exactly on every target (float8 needs sm_89 for
# its pointer type; bool loads are normalised to 0/1) travel as bytes of the same width.
_BYTE_ALIASES = {
    torch.bool: torch.uint8,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
    torch.float8_e4m3fnuz: torch.uint8,
    torch.float8_e5m2fnuz: torch.uint8,
}


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
    LOAD_EVICT: tl.constexpr,
    STORE_CACHE: tl.constexpr,
):
    if INDEX_64:
        t = t.to(tl.int64)
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
    tile = tl.load(src + src_offs, mask=mask, eviction_policy=LOAD_EVICT)
    head_elems = rows * cols
    dst_offs = offs_r[:, None] * cols + offs_c[None, :]
    first = chunk * reps_per_program
    last = tl.minimum(first + reps_per_program, n_rep)
    for r in range(first, last):
        tl.store(dst + (bh * n_rep + r) * head_elems + dst_offs, tile, mask=mask, cache_modifier=STORE_CACHE)


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
    LOAD_EVICT: tl.constexpr,
    STORE_CACHE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < k_programs:
        _expand_tile(k, k_out, pid, n_rep, kv_heads, k_rows, k_cols, k_sb, k_sh, k_sr, k_sc,
                     k_tiles_r, k_tiles_c, rep_chunks, reps_per_program,
                     K_BLOCK_R, K_BLOCK_C, INDEX_64, REP_MAJOR, LOAD_EVICT, STORE_CACHE)  # fmt: skip
    else:
        _expand_tile(v, v_out, pid - k_programs, n_rep, kv_heads, v_rows, v_cols, v_sb, v_sh,
                     v_sr, v_sc, v_tiles_r, v_tiles_c, rep_chunks, reps_per_program,
                     V_BLOCK_R, V_BLOCK_C, INDEX_64, REP_MAJOR, LOAD_EVICT, STORE_CACHE)  # fmt: skip


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
    N_REP: tl.constexpr,
    UNROLL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
    INDEX_64: tl.constexpr,
    LOAD_CACHE: tl.constexpr,
    LOAD_EVICT: tl.constexpr,
):
    if INDEX_64:
        t = t.to(tl.int64)
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
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=ACC_DTYPE)
    # UNROLL loads are unrolled per step so several are in flight together; the summation
    # order is fixed (head 0, 1, ..., n_rep - 1) whatever UNROLL, the tiling or the hints.
    for r0 in range(0, N_REP - N_REP % UNROLL, UNROLL):
        for u in tl.static_range(UNROLL):
            x = tl.load(
                group + (r0 + u) * s_h, mask=mask, cache_modifier=LOAD_CACHE, eviction_policy=LOAD_EVICT
            )
            acc += x.to(ACC_DTYPE)
    for u in tl.static_range(N_REP % UNROLL):
        r = N_REP - N_REP % UNROLL + u
        x = tl.load(group + r * s_h, mask=mask, cache_modifier=LOAD_CACHE, eviction_policy=LOAD_EVICT)
        acc += x.to(ACC_DTYPE)
    dst_offs = bh * (rows * cols) + offs_r[:, None] * cols + offs_c[None, :]
    tl.store(dst + dst_offs, acc.to(dst.dtype.element_ty), mask=mask)


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
    v_rows,
    v_cols,
    v_sb,
    v_sh,
    v_sr,
    v_sc,
    v_tiles_r,
    v_tiles_c,
    k_programs,
    N_REP: tl.constexpr,
    UNROLL: tl.constexpr,
    K_BLOCK_R: tl.constexpr,
    K_BLOCK_C: tl.constexpr,
    V_BLOCK_R: tl.constexpr,
    V_BLOCK_C: tl.constexpr,
    K_ACC: tl.constexpr,
    V_ACC: tl.constexpr,
    INDEX_64: tl.constexpr,
    LOAD_CACHE: tl.constexpr,
    LOAD_EVICT: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < k_programs:
        _reduce_tile(gk, gk_out, pid, kv_heads, k_rows, k_cols, k_sb, k_sh, k_sr, k_sc,
                     k_tiles_r, k_tiles_c, N_REP, UNROLL, K_BLOCK_R, K_BLOCK_C, K_ACC, INDEX_64,
                     LOAD_CACHE, LOAD_EVICT)  # fmt: skip
    else:
        _reduce_tile(gv, gv_out, pid - k_programs, kv_heads, v_rows, v_cols, v_sb, v_sh, v_sr,
                     v_sc, v_tiles_r, v_tiles_c, N_REP, UNROLL, V_BLOCK_R, V_BLOCK_C, V_ACC, INDEX_64,
                     LOAD_CACHE, LOAD_EVICT)  # fmt: skip


def _layout(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, int, int, int, int, int]:
    """``(rows, cols, s_b, s_h, s_r, s_c)``: one head as a 2-D ``[rows, cols]`` array.

    ``(N, D)`` folds into a single run when a row's stride is the row length, so packed
    heads are copied as long 1-D runs whatever D is (no masked lanes for D = 80 or 96).
    """
    _, _, n, d = shape
    s_b, s_h, s_n, s_d = stride
    if d == 1:
        return 1, n, s_b, s_h, 0, s_n
    if n == 1 or s_n == d * s_d:
        return 1, n * d, s_b, s_h, 0, s_d
    return n, d, s_b, s_h, s_n, s_d


def _reach(shape: tuple[int, ...], layout: tuple[int, ...], tiling: Tiling, out_heads: int) -> int:
    """Largest element offset a program may form, masked lanes included, input or output."""
    b, h = shape[0], shape[1]
    _, _, s_b, s_h, s_r, s_c = layout
    padded_r = tiling.tiles_r * tiling.block_r
    padded_c = tiling.tiles_c * tiling.block_c
    src = (b - 1) * s_b + (h - 1) * s_h + (padded_r - 1) * s_r + (padded_c - 1) * s_c
    return max(src, b * out_heads * padded_r * padded_c)


def _as_copyable(x: Tensor) -> Tensor:
    alias = _BYTE_ALIASES.get(x.dtype)
    return x if alias is None else x.view(alias)


# Stand-ins for a tensor with no elements: its branch of the kernel gets no programs.
_EMPTY_LAYOUT = (0, 0, 0, 0, 0, 0)
_EMPTY_TILING = Tiling(1, 1, 0, 0, 1)


class Plan:
    """One launch's grid, scalar arguments and meta-parameters, plus its compiled kernels.

    Plans are cached by shape, strides and element types; once a plan's kernel has been
    compiled for a device, dtypes and pointer alignments, later calls launch the compiled
    handle directly (``_launch``), skipping Triton's per-call argument binding: that
    binding is most of an eager call's host time on small shapes.
    """

    __slots__ = ("args", "compiled", "grid", "meta")

    def __init__(self, grid: tuple[int], args: tuple[int, ...], meta: dict[str, object]) -> None:
        self.grid, self.args, self.meta = grid, args, meta
        # Launch key -> (Triton's compiled kernel, the constexpr values it takes last).
        self.compiled: dict[tuple[object, ...], tuple[Any, list[object]]] = {}


_RUNTIME_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


def _launch_hooks_set() -> bool:
    """Whether a profiler asked Triton for launch hooks (then launches keep Triton's own path)."""
    if _RUNTIME_KNOBS is None:
        return True
    for hook in (_RUNTIME_KNOBS.launch_enter_hook, _RUNTIME_KNOBS.launch_exit_hook):
        # Triton >= 3.4 keeps an always-present chain of hooks; older ones a callable or None.
        calls = getattr(hook, "calls", None)
        if bool(calls) if calls is not None else hook is not None:
            return True
    return False


def _launch(kernel: triton.runtime.JITFunction, plan: Plan, tensors: tuple[Tensor, ...]) -> None:
    """Launch ``kernel`` on the current stream of the tensors' device.

    ``tensors`` is ``(in_a, in_b, out_a, out_b)``. Triton specialises a kernel on its
    pointers' dtypes and 16-byte alignment; the outputs share the inputs' dtypes and come
    fresh from the caching allocator (aligned), so the inputs alone key the compiled handle.
    """
    a, b = tensors[0], tensors[1]
    index = a.get_device()
    key = (index, a.dtype, b.dtype, a.data_ptr() % 16 == 0, b.data_ptr() % 16 == 0)
    compiled = plan.compiled.get(key)
    if compiled is None or _launch_hooks_set():
        with torch.cuda.device(index):
            compiled = kernel[plan.grid](*tensors, *plan.args, **plan.meta)
        # The interpreter returns no handle; profilers' launch hooks need Triton's own path.
        if compiled is not None and hasattr(compiled, "packed_metadata") and not _launch_hooks_set():
            plan.compiled[key] = (
                compiled,
                [plan.meta[n] for n in kernel.arg_names[len(tensors) + len(plan.args) :]],
            )
        return
    if index != torch._C._cuda_getDevice():
        with torch.cuda.device(index):
            return _launch(kernel, plan, tensors)
    handle, constexprs = compiled
    # The same call Triton's JIT makes after binding: grid, stream, function, metadata,
    # no launch hooks, then every kernel parameter in declaration order.
    handle.run(plan.grid[0], 1, 1, torch._C._cuda_getCurrentRawStream(index), handle.function,
               handle.packed_metadata, None, None, None, *tensors, *plan.args, *constexprs)  # fmt: skip


def _tensor_part(
    shape: tuple[int, ...],
    stride: tuple[int, ...],
    itemsize: int,
    heads: int,
    tiling_for: Callable[..., Tiling],
) -> tuple[tuple[int, int, int, int, int, int], Tiling, int]:
    """One tensor's layout, tiling and program count (0 when it has no elements)."""
    if math.prod(shape) == 0:
        return _EMPTY_LAYOUT, _EMPTY_TILING, 0
    layout = _layout(shape, stride)
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
) -> list[int]:
    """Append both tensors' scalar arguments and block sizes; set the shared meta-parameters.

    Returns the two program counts (the caller decides the grid).
    """
    parts = [_tensor_part(*t, heads, tiling_for) for t in zip(shapes, strides, itemsizes)]
    for name, (layout, tiling, _) in zip("KV", parts):
        args += [*layout, tiling.tiles_r, tiling.tiles_c]
        meta[f"{name}_BLOCK_R"], meta[f"{name}_BLOCK_C"] = tiling.block_r, tiling.block_c
    live = [(shape, layout, tiling) for shape, (layout, tiling, programs) in zip(shapes, parts) if programs]
    if live:
        meta["INDEX_64"] = max(_reach(*part, out_heads) for part in live) > _INT32_LIMIT
        meta["num_warps"] = max(tiling.num_warps for _, _, tiling in live)
    return [programs for _, _, programs in parts]


@functools.lru_cache(maxsize=1024)
def _expand_plan(
    k_shape: tuple[int, ...],
    k_stride: tuple[int, ...],
    k_itemsize: int,
    v_shape: tuple[int, ...],
    v_stride: tuple[int, ...],
    v_itemsize: int,
    n_rep: int,
) -> Plan | None:
    """Grid, scalar arguments and meta-parameters of one expansion; ``None``: nothing to copy.

    Cached by shape, strides and item sizes, so a repeated call skips this arithmetic.
    """
    kv_heads = k_shape[1]
    args: list[int] = [n_rep, kv_heads]
    meta: dict[str, object] = dict(launch_settings.expand_hints(n_rep))
    programs = _plan_parts((k_shape, v_shape), (k_stride, v_stride), (k_itemsize, v_itemsize),
                           k_shape[0] * kv_heads, kv_heads * n_rep, expand_tiling, args, meta)  # fmt: skip
    if not any(programs):
        return None
    plane_bytes = max(
        shape[2] * shape[3] * itemsize
        for shape, itemsize, count in zip((k_shape, v_shape), (k_itemsize, v_itemsize), programs)
        if count
    )
    rep_chunks, reps_per_program, meta["REP_MAJOR"] = rep_split(sum(programs), n_rep, plane_bytes)
    k_programs, v_programs = (count * rep_chunks for count in programs)
    args += [rep_chunks, reps_per_program, k_programs]
    return Plan((k_programs + v_programs,), tuple(args), meta)


def expand_forward(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    """``[B, H_kv, N, D] -> [B, H_kv * n_rep, N, D]`` for k and v in one launch."""
    k_shape, v_shape = k.shape, v.shape
    k_out = k.new_empty((k_shape[0], k_shape[1] * n_rep, k_shape[2], k_shape[3]))
    v_out = v.new_empty((v_shape[0], v_shape[1] * n_rep, v_shape[2], v_shape[3]))
    plan = _expand_plan(k_shape, k.stride(), k.element_size(), v_shape, v.stride(), v.element_size(), n_rep)
    if plan is not None:
        tensors = (_as_copyable(k), _as_copyable(v), _as_copyable(k_out), _as_copyable(v_out))
        if k.is_cuda:
            _launch(expand_fwd_kernel, plan, tensors)
        else:
            expand_fwd_kernel[plan.grid](*tensors, *plan.args, **plan.meta)
    return k_out, v_out


_ACC_DTYPES = {torch.float64: tl.float64}


@functools.lru_cache(maxsize=1024)
def _reduce_plan(
    k_shape: tuple[int, ...],
    k_stride: tuple[int, ...],
    k_dtype: torch.dtype,
    v_shape: tuple[int, ...],
    v_stride: tuple[int, ...],
    v_dtype: torch.dtype,
    n_rep: int,
) -> Plan | None:
    """Grid, scalar arguments and meta-parameters of one reduction; ``None``: nothing to sum."""
    kv_heads = k_shape[1] // n_rep
    args: list[int] = [kv_heads]
    meta: dict[str, object] = {
        "N_REP": n_rep,
        "UNROLL": min(n_rep, launch_settings.REDUCE_UNROLL),
        "K_ACC": _ACC_DTYPES.get(k_dtype, tl.float32),
        "V_ACC": _ACC_DTYPES.get(v_dtype, tl.float32),
        **launch_settings.reduce_hints(n_rep),
    }
    tiling = functools.partial(reduce_tiling, n_rep=n_rep)
    programs = _plan_parts((k_shape, v_shape), (k_stride, v_stride), (k_dtype.itemsize, v_dtype.itemsize),
                           k_shape[0] * kv_heads, kv_heads, tiling, args, meta)  # fmt: skip
    if not any(programs):
        return None
    args.append(programs[0])
    return Plan((sum(programs),), tuple(args), meta)


def reduce_backward(grad_k: Tensor, grad_v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    """``[B, H, N, D] -> [B, H // n_rep, N, D]``, summing each group, both gradients in one launch."""
    k_shape, v_shape = grad_k.shape, grad_v.shape
    gk_out = grad_k.new_empty((k_shape[0], k_shape[1] // n_rep, k_shape[2], k_shape[3]))
    gv_out = grad_v.new_empty((v_shape[0], v_shape[1] // n_rep, v_shape[2], v_shape[3]))
    plan = _reduce_plan(k_shape, grad_k.stride(), grad_k.dtype, v_shape, grad_v.stride(), grad_v.dtype, n_rep)
    if plan is not None:
        tensors = (grad_k, grad_v, gk_out, gv_out)
        if grad_k.is_cuda:
            _launch(reduce_bwd_kernel, plan, tensors)
        else:
            reduce_bwd_kernel[plan.grid](*tensors, *plan.args, **plan.meta)
    return gk_out, gv_out

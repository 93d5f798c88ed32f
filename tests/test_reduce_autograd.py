"""Backward: ``gqa_reduce`` sums each group in float32 (or wider); autograd to any order."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given

from helpers import GRAD_DTYPES, LAYOUTS, assert_bitwise_equal, assert_reduce_close, make_tensor, short
from strategies import Case, grad_cases


def _reduce(gk: torch.Tensor, gv: torch.Tensor, n_rep: int) -> tuple[torch.Tensor, torch.Tensor]:
    heads = gk.shape[1]
    return torch.ops.neuralops.gqa_reduce(gk, gv, heads // n_rep, heads)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=short)
def test_reduce_layouts(backend: str, device: str, dtype: torch.dtype, layout: str) -> None:
    gk = make_tensor((2, 12, 9, 80), dtype, layout, device, seed=1)
    gv = make_tensor((2, 12, 9, 24), dtype, "bnhd", device, seed=2)
    out_k, out_v = _reduce(gk, gv, 4)
    assert_reduce_close(out_k, gk, 3)
    assert_reduce_close(out_v, gv, 3)


@pytest.mark.parametrize("n_rep", [1, 2, 7, 40])
def test_reduce_group_sizes(backend: str, device: str, n_rep: int) -> None:
    """Large groups take the kernel's rolled loop; n_rep == 1 is a plain copy."""
    gk = make_tensor((1, 2 * n_rep, 5, 33), torch.float32, "contiguous", device, seed=n_rep)
    out_k, out_v = _reduce(gk, gk, n_rep)
    assert_reduce_close(out_k, gk, 2)
    assert_reduce_close(out_v, gk, 2)
    assert out_k.data_ptr() != out_v.data_ptr()


def test_reduce_mixed_dtypes_and_empty(backend: str, device: str) -> None:
    gk = make_tensor((2, 4, 5, 16), torch.bfloat16, "contiguous", device, seed=3)
    gv = make_tensor((2, 4, 5, 0), torch.float64, "contiguous", device)
    out_k, out_v = _reduce(gk, gv, 2)
    assert_reduce_close(out_k, gk, 2)
    assert out_v.shape == (2, 2, 5, 0) and out_v.dtype == torch.float64


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=short)
def test_reduce_propagates_nan(backend: str, device: str, dtype: torch.dtype) -> None:
    """A NaN sums to NaN and an infinity to an infinity in every gradient dtype (the
    half-precision results are rounded from float32 bits, where the two differ by one bit)."""
    g = make_tensor((1, 4, 3, 8), dtype, "contiguous", device, seed=4)
    g[0, 1, 2, 5] = float("nan")
    g[0, 2, 0, 0] = float("inf")
    out, _ = _reduce(g, g, 2)
    assert torch.isnan(out[0, 0, 2, 5]) and torch.isinf(out[0, 1, 0, 0])
    assert torch.isfinite(out).sum() == out.numel() - 2


@pytest.mark.parametrize("layout", ["contiguous", "bnhd"])
def test_gradcheck_and_gradgradcheck(backend: str, device: str, layout: str) -> None:
    k = make_tensor((2, 2, 3, 5), torch.float64, layout, device, seed=5).requires_grad_()
    v = make_tensor((2, 2, 3, 4), torch.float64, "offset", device, seed=6).detach().requires_grad_()

    def fn(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.neuralops.gqa_expand(k, v, 2, 6)

    # fast_mode projects the Jacobian on random vectors: a few calls instead of one per
    # element, which keeps the Triton interpreter quick; it still fails on a wrong formula.
    assert torch.autograd.gradcheck(fn, (k, v), fast_mode=True)
    assert torch.autograd.gradgradcheck(fn, (k, v), fast_mode=True)

    def reduce_fn(gk: torch.Tensor, gv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.neuralops.gqa_reduce(gk, gv, 2, 6)

    gk = make_tensor((2, 6, 3, 5), torch.float64, layout, device, seed=7).requires_grad_()
    gv = make_tensor((2, 6, 3, 4), torch.float64, "contiguous", device, seed=8).requires_grad_()
    assert torch.autograd.gradcheck(reduce_fn, (gk, gv), fast_mode=True)
    assert torch.autograd.gradgradcheck(reduce_fn, (gk, gv), fast_mode=True)


@pytest.mark.parametrize("used", ["k", "v", "both"])
def test_backward_non_contiguous_grads_and_unused_outputs(backend: str, device: str, used: str) -> None:
    k = make_tensor((2, 2, 6, 16), torch.float32, "bnhd", device, seed=9).requires_grad_()
    v = make_tensor((2, 2, 6, 8), torch.float32, "contiguous", device, seed=10).requires_grad_()
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, 2, 8)
    # Gradients arrive transposed (from a [B, N, H, D] consumer).
    gk = make_tensor((2, 8, 6, 16), torch.float32, "bnhd", device, seed=11)
    gv = make_tensor((2, 8, 6, 8), torch.float32, "permuted", device, seed=12)
    outs, grads = [], []
    if used in ("k", "both"):
        outs.append(k_out)
        grads.append(gk)
    if used in ("v", "both"):
        outs.append(v_out)
        grads.append(gv)
    torch.autograd.backward(outs, grads)
    if used in ("k", "both"):
        assert_reduce_close(k.grad, gk, 2, op_output=False)
    else:
        assert k.grad is None
    if used in ("v", "both"):
        assert_reduce_close(v.grad, gv, 2, op_output=False)
    else:
        assert v.grad is None


def test_backward_only_one_input_requires_grad(backend: str, device: str) -> None:
    k = make_tensor((1, 2, 4, 8), torch.bfloat16, "contiguous", device, seed=13)
    v = make_tensor((1, 2, 4, 8), torch.bfloat16, "contiguous", device, seed=14).requires_grad_()
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, 2, 4)
    assert not k_out.requires_grad and v_out.requires_grad
    g = make_tensor((1, 4, 4, 8), torch.bfloat16, "contiguous", device, seed=15)
    (v_out * g).sum().backward()
    assert_reduce_close(v.grad, g, 2, op_output=False)


def test_double_backward_matches_repeat_interleave(backend: str, device: str) -> None:
    k = make_tensor((2, 2, 3, 4), torch.float64, "contiguous", device, seed=16).requires_grad_()
    v = make_tensor((2, 2, 3, 4), torch.float64, "contiguous", device, seed=17).requires_grad_()

    def loss(expand: object) -> tuple[torch.Tensor, ...]:
        ko, vo = expand(k, v)  # type: ignore[operator]
        first = (ko.sin() * vo).sum()
        gk, gv = torch.autograd.grad(first, (k, v), create_graph=True)
        return torch.autograd.grad((gk**2).sum() + (gv**3).sum(), (k, v))

    ours = loss(lambda k, v: torch.ops.neuralops.gqa_expand(k, v, 2, 6))
    ref = loss(lambda k, v: (k.repeat_interleave(3, 1), v.repeat_interleave(3, 1)))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@given(case=grad_cases())
def test_fuzz_reduce(backend: str, device: str, case: Case) -> None:
    heads = case.num_heads
    gk = make_tensor(
        (case.batch, heads, case.seq, case.dim_k), case.dtype_k, case.layout_k, device, case.seed
    )
    gv = make_tensor(
        (case.batch, heads, case.seq, case.dim_v), case.dtype_v, case.layout_v, device, case.seed + 1
    )
    out_k, out_v = _reduce(gk, gv, case.n_rep)
    assert_reduce_close(out_k, gk, case.kv_heads)
    assert_reduce_close(out_v, gv, case.kv_heads)


def test_reduce_is_deterministic(backend: str, device: str) -> None:
    """Bitwise-equal gradients across repeated runs, and across launch settings that keep the
    summation order (tile sizes, unroll depth, warps, cache hints: each element still sums
    heads 0..n_rep-1)."""
    g_k = make_tensor((2, 12, 40, 80), torch.bfloat16, "bnhd", device, seed=1)
    g_v = make_tensor((2, 12, 40, 24), torch.float32, "offset", device, seed=2)
    first = torch.ops.neuralops.gqa_reduce(g_k, g_v, 2, 12)
    for _ in range(3):
        for a, b in zip(torch.ops.neuralops.gqa_reduce(g_k, g_v, 2, 12), first):
            assert_bitwise_equal(a, b)
    if backend != "triton":
        return
    from csrc_free_ops import gqa_triton
    from csrc_free_ops.launch_settings import DEFAULT

    blocks = set()
    for tile_bytes, unroll, hints, per_warp in [(512, 1, 0, 1024), (4096, 4, 1, 512), (32768, 16, 1, 2048)]:
        # WAVES=0: tiles as large as TILE_BYTES allows.
        settings = replace(DEFAULT, WAVES=0, TILE_BYTES=tile_bytes, REDUCE_UNROLL=unroll, CACHE_HINTS=hints, REDUCE_CACHE_HINTS_MIN_L2S=0,
                           REDUCE_SHORT_GROUP_BYTES_PER_WARP=per_warp)  # fmt: skip
        plan = gqa_triton._reduce_plan(g_k.shape, g_k.stride(), g_k.dtype, g_v.shape, g_v.stride(), g_v.dtype,
                                       6, gqa_triton._device_props(g_k.device), settings)  # fmt: skip
        assert plan is not None and plan.meta["UNROLL"] == min(6, unroll)
        assert plan.meta["HINTS"] == bool(hints)
        blocks.add((plan.meta["K_BLOCK_R"], plan.meta["K_BLOCK_C"]))
        for a, b in zip(gqa_triton.reduce_backward(g_k, g_v, 6, settings=settings), first):
            assert_bitwise_equal(a, b)
    assert len(blocks) == 3  # three different tilings really ran


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=short)
def test_low_precision_reduce_rounds_once_to_nearest(backend: str, device: str, dtype: torch.dtype) -> None:
    """A float32 sum, then one rounding to nearest even: exactly, on every backend (Triton's
    interpreter truncated bfloat16 until the kernel rounded explicitly)."""
    if dtype == torch.bfloat16:
        head = [256.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]  # 263 in float32: 262 truncated, 264 rounded
        g = torch.tensor(head, dtype=dtype).reshape(1, 8, 1, 1).expand(1, 8, 2, 4).contiguous().to(device)
        gk, _ = torch.ops.neuralops.gqa_reduce(g, g, 1, 8)
        assert gk.flatten().tolist() == [264.0] * 8
    # Integers of the dtype's full precision (8 significant bits for bfloat16, 11 for
    # float16), scaled by a power of two: a sum of 8 needs at most 3 more bits, so it is
    # exact in float32 whatever the order of the additions (ATen's sum below splits the dim;
    # the op adds heads in order), and only the final rounding to the dtype can differ.
    bits = {torch.bfloat16: 8, torch.float16: 11}[dtype]
    ints = torch.randint(1 - 2**bits, 2**bits, (2, 16, 8, 16), generator=torch.Generator().manual_seed(3))
    g = (ints.float() * 2.0**-bits).to(device=device, dtype=dtype)
    assert torch.equal(g.float().cpu(), ints.float() * 2.0**-bits)  # exact in the dtype
    for out in torch.ops.neuralops.gqa_reduce(g, g, 2, 16):
        expected = g.float().unflatten(1, (2, 8)).sum(2).to(dtype)
        assert torch.equal(out, expected)
    # Sums that need rounding happened: not every group sum is representable in the dtype.
    assert not torch.equal(expected.float(), g.float().unflatten(1, (2, 8)).sum(2))


@pytest.mark.parametrize("layout", ["contiguous", "bnhd"])
@pytest.mark.parametrize("n_rep", [1, 2, 3, 4, 5, 7, 24, 32, 71, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64], ids=short)
def test_reduce_sums_in_head_order(
    backend: str, device: str, n_rep: int, dtype: torch.dtype, layout: str
) -> None:
    """Each KV head is the sum of its group in head order, one addition after the other from
    +0.0, in float32 (float64 for float64): bit for bit an explicit loop, on every backend,
    group length and layout (ATen's own sum splits groups of 5 or more over several
    accumulators; the reference uses it on a CPU for shorter groups only)."""
    grad = make_tensor((1, 2 * n_rep, 3, 40), dtype, layout, device, seed=n_rep)
    grad[:, :n_rep, 0] = -0.0  # a group of negative zeros sums to +0.0 (0.0 + -0.0)
    acc_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    expected = torch.zeros((1, 2, 3, 40), dtype=acc_dtype, device=device)
    for r in range(n_rep):
        expected = expected + grad.unflatten(1, (2, n_rep))[:, :, r].to(acc_dtype)
    out, _ = torch.ops.neuralops.gqa_reduce(grad, grad, 2, 2 * n_rep)
    assert_bitwise_equal(out, expected.to(dtype))

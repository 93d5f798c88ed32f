"""The Triton launchers' own decisions: layouts, 64-bit offsets, grid sizes, no empty launches."""

from __future__ import annotations

import pytest
import torch

from helpers import assert_bitwise_equal, expand_oracle, in_threads, make_tensor

gqa_triton = pytest.importorskip("csrc_free_ops.gqa_triton", reason="triton is not installed")
from csrc_free_ops.launch_settings import REFERENCE_DEVICE as H200  # noqa: E402
from csrc_free_ops.launch_settings import Device  # noqa: E402


def test_layout_folds_packed_rows() -> None:
    # Packed heads fold (N, D) into one run; a transposed [B, N, H, D] view stays 2-D.
    assert gqa_triton._layout((2, 4, 16, 80), (5120, 1280, 80, 1)) == (1, 1280, 5120, 1280, 0, 1)
    assert gqa_triton._layout((2, 4, 16, 80), (5120, 80, 320, 1)) == (16, 80, 5120, 80, 320, 1)
    assert gqa_triton._layout((2, 4, 16, 1), (64, 16, 1, 7)) == (1, 16, 64, 16, 0, 1)
    # Rows D elements apart whose elements are not adjacent (B*H == D here): no fold.
    assert gqa_triton._layout((2, 2, 3, 4), (1, 2, 4, 12)) == (3, 4, 1, 2, 4, 12)


def test_rows_d_apart_with_strided_elements_copy_and_sum_exactly(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A permuted tensor whose row stride equals D but whose elements are strided (B*H == D)
    is copied and summed element by element, not as one folded run."""
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = make_tensor((4, 3, 2, 2), torch.float32, "contiguous", device, seed=1).permute(2, 3, 1, 0)
    assert x.shape == (2, 2, 3, 4) and x.stride() == (2, 1, 4, 12)
    out, _ = gqa_triton.expand_forward(x, x, 3)
    assert_bitwise_equal(out, expand_oracle(x, 3))
    g = make_tensor((12, 3, 2, 6), torch.float32, "contiguous", device, seed=2).permute(2, 3, 1, 0)
    assert g.shape == (2, 6, 3, 12) and g.stride() == (6, 1, 12, 36)
    total, _ = gqa_triton.reduce_backward(g, g, 3)
    torch.testing.assert_close(total, g.unflatten(1, (2, 3)).sum(2), rtol=1e-6, atol=1e-6)


def test_index_64_chosen_only_past_int32() -> None:
    small = gqa_triton._expand_plan((4, 8, 4096, 128), (4 * 2**20, 2**19, 128, 1), 2,
                                    (4, 8, 4096, 128), (4 * 2**20, 2**19, 128, 1), 2, 4, H200)  # fmt: skip
    # B=8, 8 -> 64 heads, N=32768, D=128: 2^31 output elements per tensor.
    big_shape, big_stride = (8, 8, 32768, 128), (2**25, 2**22, 128, 1)
    big = gqa_triton._expand_plan(big_shape, big_stride, 2, big_shape, big_stride, 2, 8, H200)
    assert small is not None and big is not None
    assert small.meta["INDEX_64"] is False
    assert big.meta["INDEX_64"] is True
    # A small tensor whose batch stride reaches past 2^31 (a view into a huge buffer).
    far = gqa_triton._expand_plan(
        (2, 1, 4, 8), (2**31, 32, 8, 1), 2, (2, 1, 4, 8), (32, 32, 8, 1), 2, 2, H200
    )
    assert far is not None and far.meta["INDEX_64"] is True
    # The reduction's gradient: 8 x 64 x 32768 x 128 reaches exactly 2^31 - 1, the
    # largest int32 offset; one more batch row goes past it.
    edge = ((8, 64, 32768, 128), (2**28, 2**22, 128, 1), torch.bfloat16)
    past = ((9, 64, 32768, 128), (2**28, 2**22, 128, 1), torch.bfloat16)
    edge_plan = gqa_triton._reduce_plan(*edge, *edge, 8, H200)
    past_plan = gqa_triton._reduce_plan(*past, *past, 8, H200)
    assert edge_plan is not None and edge_plan.meta["INDEX_64"] is False
    assert past_plan is not None and past_plan.meta["INDEX_64"] is True


def test_reduction_into_strided_results_unfolds_only_where_they_are() -> None:
    """A result laid out [B, N, H, D] gives up the folded run (its heads aren't packed); a
    packed one keeps it; the offsets a strided result reaches choose 64-bit indexing."""
    shape, grad_stride = (2, 8, 16, 80), (10240, 1280, 80, 1)

    def plan(out: tuple[int, ...] | None) -> gqa_triton.Plan:
        made = gqa_triton._reduce_plan(shape, grad_stride, torch.float32, shape, grad_stride, torch.float32, 4,
                                       H200, out_strides=(out, None))  # fmt: skip
        assert made is not None
        return made

    bnhd, packed, contiguous = plan((2560, 80, 160, 1)), plan((2560, 1280, 80, 1)), plan(None)
    # k's (rows, cols, strides), then its tiles, then its result's (d_b, d_h, d_r).
    assert bnhd.args[1:7] == (16, 80, 10240, 1280, 80, 1)
    assert packed.args[1:7] == contiguous.args[1:7] == (1, 1280, 10240, 1280, 0, 1)
    assert bnhd.args[9:12] == (2560, 80, 160)
    assert contiguous.args[9:12] == (2560, 1280, 1280)
    assert contiguous.meta["INDEX_64"] is False
    # A result whose batch stride reaches past 2^31 (a view into a huge buffer) needs 64-bit
    # offsets where the contiguous result does not.
    assert plan((2**31, 80, 160, 1)).meta["INDEX_64"] is True


@pytest.mark.parametrize(
    ("shape", "n_rep", "dtype"),
    [((2, 3, 10, 80), 4, torch.bfloat16), ((1, 2, 1, 64), 3, torch.float32), ((2, 3, 7, 1), 2, torch.float16),
     ((2, 1, 5, 24), 5, torch.float64)],
    ids=["D80-bf16", "N1-f32", "D1-f16", "Hkv1-f64"],
)  # fmt: skip
def test_reduction_writes_results_with_the_strides_it_is_given(
    device: str, shape: tuple[int, int, int, int], n_rep: int, dtype: torch.dtype
) -> None:
    """Results laid out [B, N, H, D] (with k's and v's own strides) hold the same bits as the
    contiguous results of the same launch rules, whatever the gradients' layouts."""
    b, kv, n, d = shape
    grads = (make_tensor((b, kv * n_rep, n, d), dtype, "contiguous", device, seed=1),
             make_tensor((b, kv * n_rep, n, d + 8), dtype, "bnhd", device, seed=2))  # fmt: skip
    strides = tuple(torch.empty(b, n, kv, g.shape[3]).transpose(1, 2).stride() for g in grads)
    contiguous = gqa_triton.reduce_launch(*grads, n_rep)(*grads)
    strided = gqa_triton.reduce_launch(*grads, n_rep, out_strides=strides)(*grads)
    for got, want, stride in zip(strided, contiguous, strides):
        assert got is not None and want is not None
        assert got.stride() == stride and want.is_contiguous()
        assert_bitwise_equal(got, want)


def test_empty_plans_launch_nothing() -> None:
    assert (
        gqa_triton._expand_plan((0, 2, 5, 8), (80, 40, 8, 1), 4, (0, 2, 5, 8), (80, 40, 8, 1), 4, 3, H200)
        is None
    )
    assert gqa_triton._reduce_plan((2, 6, 0, 8), (0, 0, 8, 1), torch.float32,
                                   (2, 6, 0, 8), (0, 0, 8, 1), torch.float32, 3, H200) is None  # fmt: skip


def test_long_groups_up_to_32_reps_store_in_output_order() -> None:
    """Falcon-180B's 29-head groups at 738 MB walk the output like short groups do (a
    program storing all 29 copies of its tile lagged a same-size copy); MQA's 48 don't."""

    def rep_major(kv_heads: int, n_rep: int, shape: tuple[int, int, int]) -> bool:
        batch, seq, dim = shape
        full = (batch, kv_heads, seq, dim)
        stride = (kv_heads * seq * dim, seq * dim, dim, 1)
        plan = gqa_triton._expand_plan(full, stride, 2, full, stride, 2, n_rep, H200)
        assert plan is not None
        return bool(plan.meta["REP_MAJOR"])

    assert rep_major(8, 29, (4, 3001, 64))
    assert not rep_major(1, 48, (6, 2500, 128))


def test_rep_chunks_that_do_not_divide_the_group_store_nothing_past_it(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tile's 7 stores shared out 4 and 3 (a two-SM device wants more programs than tiles):
    every output head is its KV head's copy, and nothing past the last group is written."""
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = make_tensor((1, 2, 3, 8), torch.float32, "contiguous", device, seed=1)
    v = make_tensor((1, 2, 3, 4), torch.float16, "bnhd", device, seed=2)
    plan = gqa_triton._expand_plan(
        k.shape, k.stride(), 4, v.shape, v.stride(), 2, 7, Device(sms=2, l2_bytes=2**20)
    )
    assert plan is not None
    rep_chunks, reps_per_program = plan.args[-3:-1]
    assert rep_chunks > 1 and rep_chunks * reps_per_program > 7  # the last chunk is short
    filled = []
    for x in (k, v):
        n = x.numel() * 7
        buffer = torch.full((n + 64,), float("nan"), dtype=x.dtype, device=device)  # the tail: a sentinel
        filled.append((buffer, buffer[:n].view(x.shape[0], 14, *x.shape[2:])))
    gqa_triton.expand_fwd_kernel[plan.grid](k, v, filled[0][1], filled[1][1], *plan.args, **plan.meta)
    for x, (buffer, out) in zip((k, v), filled):
        assert_bitwise_equal(out, expand_oracle(x, 7))
        assert buffer[out.numel() :].isnan().all()


def test_grid_covers_both_tensors() -> None:
    plan = gqa_triton._expand_plan(
        (2, 2, 8, 16), (256, 128, 16, 1), 4, (2, 2, 8, 0), (0, 0, 0, 1), 4, 3, H200
    )
    assert plan is not None
    k_programs = plan.args[-1]
    assert plan.grid == (k_programs,)  # v has no elements: no programs for it


@pytest.mark.parametrize("index_64", [False, True])
def test_int64_offset_path_matches(device: str, index_64: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the kernel with 64-bit offsets forced on a small input: same bits as the 32-bit path."""
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = make_tensor((2, 3, 10, 24), torch.bfloat16, "bnhd", device, seed=1)
    v = make_tensor((2, 3, 10, 40), torch.float32, "offset", device, seed=2)
    plan = gqa_triton._expand_plan(k.shape, k.stride(), 2, v.shape, v.stride(), 4, 5, H200)
    assert plan is not None
    grid, args, meta = plan.grid, plan.args, plan.meta
    k_out = torch.empty(2, 15, 10, 24, dtype=k.dtype, device=device)
    v_out = torch.empty(2, 15, 10, 40, dtype=v.dtype, device=device)
    gqa_triton.expand_fwd_kernel[grid](k, v, k_out, v_out, *args, **{**meta, "INDEX_64": index_64})
    assert_bitwise_equal(k_out, expand_oracle(k, 5))
    assert_bitwise_equal(v_out, expand_oracle(v, 5))
    g = make_tensor((2, 15, 10, 24), torch.float32, "bnhd", device, seed=3)
    rplan = gqa_triton._reduce_plan(g.shape, g.stride(), g.dtype, g.shape, g.stride(), g.dtype, 5, H200)
    assert rplan is not None
    rgrid, rargs, rmeta = rplan.grid, rplan.args, rplan.meta
    outs = [torch.empty(2, 3, 10, 24, device=device) for _ in range(2)]
    gqa_triton.reduce_bwd_kernel[rgrid](g, g, *outs, *rargs, **{**rmeta, "INDEX_64": index_64})
    ref = g.double().unflatten(1, (3, 5)).sum(2)
    for out in outs:  # k's programs and v's
        torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-5)


def test_compiled_handle_launch_is_reused_and_exact(device: str) -> None:
    """After the first call, CUDA launches go straight to the compiled kernel: same bits."""
    if device != "cuda":
        pytest.skip("launching through the compiled handle exists only on CUDA; CPU runs the interpreter")
    k = make_tensor((2, 4, 33, 80), torch.bfloat16, "bnhd", device, seed=1)
    v = make_tensor((2, 4, 33, 64), torch.float16, "offset", device, seed=2)
    for seed in range(3):  # first call compiles, the next ones take the direct path
        k.copy_(make_tensor(k.shape, k.dtype, "contiguous", device, seed=10 + seed))
        k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, 4, 12)
        assert_bitwise_equal(k_out, expand_oracle(k, 3))
        assert_bitwise_equal(v_out, expand_oracle(v, 3))
    # One direct launcher, for the inputs' alignments, kept by the cached launch; called by
    # itself (the host benchmark's floor) it writes the same bits.
    launch = gqa_triton.expand_launch(k, v, 3)
    assert len(launch._runs) == 1
    run = launch.direct_run(k, v)
    assert run is not None
    k_out, v_out = torch.empty_like(k_out), torch.empty_like(v_out)
    assert run(k.data_ptr(), v.data_ptr(), k_out.data_ptr(), v_out.data_ptr())
    assert_bitwise_equal(k_out, expand_oracle(k, 3))
    assert_bitwise_equal(v_out, expand_oracle(v, 3))
    g = make_tensor((2, 12, 33, 80), torch.float32, "bnhd", device, seed=4)
    for _ in range(2):
        out, _ = torch.ops.neuralops.gqa_reduce(g, g, 4, 12)
        torch.testing.assert_close(out.double(), g.double().unflatten(1, (4, 3)).sum(2), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "layout", "n_rep"),
    [((2, 3, 10, 24), "bnhd", 5), ((1, 2, 33, 80), "contiguous", 4), ((2, 1, 7, 64), "offset", 20)],
    ids=["B2-Hkv3-rep5-N10-D24-bnhd", "B1-Hkv2-rep4-N33-D80-contiguous", "B2-Hkv1-rep20-N7-D64-offset"],
)
def test_unknown_size_rules_are_exact(device: str, shape: tuple[int, int, int, int], layout: str, n_rep: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The settings a dynamic-shape compile uses (no decision on batch or sequence size) copy
    and sum exactly like the eager ones."""
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    k = make_tensor(shape, torch.bfloat16, layout, device, seed=1)
    v = make_tensor((*shape[:3], 8), torch.float32, "contiguous", device, seed=2)
    plan = gqa_triton._expand_plan(k.shape, k.stride(), 2, v.shape, v.stride(), 4, n_rep, H200,
                                       sizes_known=False)  # fmt: skip
    eager = gqa_triton._expand_plan(k.shape, k.stride(), 2, v.shape, v.stride(), 4, n_rep, H200)
    assert plan is not None and eager is not None
    heads = shape[1] * n_rep
    k_out = torch.empty(shape[0], heads, *shape[2:], dtype=k.dtype, device=device)
    v_out = torch.empty(shape[0], heads, shape[2], 8, dtype=v.dtype, device=device)
    gqa_triton.expand_fwd_kernel[plan.grid](k, v, k_out, v_out, *plan.args, **plan.meta)
    assert_bitwise_equal(k_out, expand_oracle(k, n_rep))
    assert_bitwise_equal(v_out, expand_oracle(v, n_rep))
    g = make_tensor((shape[0], heads, *shape[2:]), torch.float32, layout, device, seed=3)
    rplan = gqa_triton._reduce_plan(g.shape, g.stride(), g.dtype, g.shape, g.stride(), g.dtype, n_rep, H200,
                                        sizes_known=False)  # fmt: skip
    assert rplan is not None
    outs = [torch.empty(shape, device=device) for _ in range(2)]
    gqa_triton.reduce_bwd_kernel[rplan.grid](g, g, *outs, *rplan.args, **rplan.meta)
    eager_out, _ = gqa_triton.reduce_backward(g, g, n_rep)
    # Bitwise equal to the eager settings: the summation order doesn't depend on the tiling.
    for out in outs:
        assert_bitwise_equal(out, eager_out)


def test_traced_launch_matches_eager(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch a compiler sees (``wrap_triton``), run eagerly: the same bits as the eager path."""
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        try:
            torch.library.wrap_triton(gqa_triton.expand_fwd_kernel)
        except RuntimeError as error:  # torch 2.11 wraps compiled kernels only
            if "only works on functions annotated with triton.jit" not in str(error):
                raise
            pytest.skip(f"this torch's wrap_triton refuses the interpreter's kernels: {error}")
    k = make_tensor((2, 2, 9, 16), torch.bool, "bnhd", device, seed=4)
    v = make_tensor((2, 2, 9, 8), torch.float16, "step", device, seed=5)
    for traced in (False, True):
        k_out, v_out = gqa_triton.expand_forward(k, v, 3, traced=traced)
        assert_bitwise_equal(k_out, expand_oracle(k, 3))
        assert_bitwise_equal(v_out, expand_oracle(v, 3))
    g = make_tensor((2, 6, 9, 16), torch.float64, "bnhd", device, seed=6)
    assert_bitwise_equal(
        gqa_triton.reduce_backward(g, g, 3, traced=True)[0], gqa_triton.reduce_backward(g, g, 3)[0]
    )


def test_interpreter_serves_threads(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen threads calling the op at once: Triton's interpreter is not reentrant, so
    interpreted launches take turns; every thread gets the right result."""
    if device == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("NEURALOPS_GQA_BACKEND", "triton")

    def work(seed: int) -> None:
        k = make_tensor((1, 2, 5, 8), torch.float32, "bnhd", device, seed=seed)
        for _ in range(3):
            out, _ = torch.ops.neuralops.gqa_expand(k, k, 2, 6)
            assert_bitwise_equal(out, expand_oracle(k, 3))

    in_threads(work, 16)

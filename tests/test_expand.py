"""Forward: ``gqa_expand`` is a bit-exact copy in interleave order, on every backend."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given

import neuralops_gqa
from helpers import (
    FORWARD_DTYPES,
    LAYOUTS,
    assert_bitwise_equal,
    case_id,
    expand_oracle,
    make_tensor,
    short,
)
from strategies import Case, cases

SHAPES = [
    # (B, H_kv, n_rep, N, D)
    (2, 4, 8, 33, 80),
    (1, 8, 4, 17, 128),
    (2, 1, 7, 9, 64),  # MQA
    (3, 2, 1, 5, 96),  # n_rep == 1 still copies
    (1, 2, 3, 4, 1),
    (2, 3, 2, 6, 192),
    (1, 1, 2, 3, 256),
]


def _expand(k: torch.Tensor, v: torch.Tensor, n_rep: int) -> tuple[torch.Tensor, torch.Tensor]:
    kv = k.shape[1]
    return torch.ops.neuralops.gqa_expand(k, v, kv, kv * n_rep)


def _check(k: torch.Tensor, v: torch.Tensor, n_rep: int) -> None:
    k_out, v_out = _expand(k, v, n_rep)
    for out, x in ((k_out, k), (v_out, v)):
        assert out.is_contiguous()
        assert out.device == x.device
        assert_bitwise_equal(out, expand_oracle(x, n_rep))
        if x.numel():
            assert out.data_ptr() != x.data_ptr()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: case_id(*s, torch.bfloat16, "")[:-6])
def test_layouts_bf16(backend: str, device: str, shape: tuple[int, ...], layout: str) -> None:
    b, kv, rep, n, d = shape
    k = make_tensor((b, kv, n, d), torch.bfloat16, layout, device, seed=1)
    v = make_tensor((b, kv, n, d + 16), torch.bfloat16, "bnhd", device, seed=2)
    _check(k, v, rep)


@pytest.mark.parametrize("dtype", FORWARD_DTYPES, ids=short)
def test_every_dtype(backend: str, device: str, dtype: torch.dtype) -> None:
    k = make_tensor((2, 2, 7, 24), dtype, "contiguous", device, seed=3)
    v = make_tensor((2, 2, 7, 40), dtype, "offset", device, seed=4)
    _check(k, v, 3)


def test_mixed_dtypes_and_head_dims(backend: str, device: str) -> None:
    k = make_tensor((2, 2, 5, 64), torch.bfloat16, "contiguous", device, seed=5)
    v = make_tensor((2, 2, 5, 80), torch.float32, "bnhd", device, seed=6)
    _check(k, v, 4)


@pytest.mark.parametrize("empty", ["B0", "N0", "D0", "Dk0"])
def test_empty(backend: str, device: str, empty: str) -> None:
    shape = {"B0": (0, 2, 5, 8), "N0": (2, 2, 0, 8), "D0": (2, 2, 5, 0), "Dk0": (2, 2, 5, 0)}[empty]
    k = make_tensor(shape, torch.float32, "contiguous", device)
    v = k if empty != "Dk0" else make_tensor((2, 2, 5, 8), torch.float32, "contiguous", device)
    k_out, v_out = _expand(k, v, 4)
    assert k_out.shape == (shape[0], 8, shape[2], shape[3])
    assert_bitwise_equal(v_out, expand_oracle(v, 4))


def test_special_values_bit_exact(backend: str, device: str) -> None:
    """NaN payloads, infinities, negative zero and subnormals survive the copy bit for bit."""
    bits32 = torch.tensor(
        [0x7FC00001, 0x7FA00000, -1, 0x7F800000, -(2**31) + 0x7F800000, -(2**31), 1, 0x00400000],
        dtype=torch.int32,
    )
    bits16 = torch.tensor([0x7FC1, 0x7F81, -1, 0x7F80, -128, -32768, 1, 0x0040], dtype=torch.int16)
    cases_ = [
        bits32.view(torch.float32),
        bits16.view(torch.bfloat16),
        bits16.view(torch.float16),
        torch.tensor([0x7F, 0xFF, 0x80, 0x01], dtype=torch.uint8).view(torch.float8_e4m3fn),
    ]
    for values in cases_:
        x = values.reshape(1, 1, 1, -1).expand(2, 2, 3, -1).to(device)
        _check(x, x, 5)


def test_n_rep_one_returns_copies_from_op(backend: str, device: str) -> None:
    k = make_tensor((1, 4, 3, 8), torch.float32, "contiguous", device)
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, k, 4, 4)
    assert k_out.data_ptr() != k.data_ptr() and v_out.data_ptr() != k.data_ptr()
    assert_bitwise_equal(k_out, k)


def test_python_wrappers(backend: str, device: str) -> None:
    k = make_tensor((2, 2, 6, 16), torch.float16, "bnhd", device, seed=7)
    v = make_tensor((2, 2, 6, 8), torch.float16, "contiguous", device, seed=8)
    k_out, v_out = neuralops_gqa.gqa_expand(k, v, 2, 6)
    assert_bitwise_equal(k_out, expand_oracle(k, 3))
    assert_bitwise_equal(v_out, expand_oracle(v, 3))
    assert_bitwise_equal(neuralops_gqa.repeat_kv(k, 5), expand_oracle(k, 5))
    # Like Hugging Face's repeat_kv, no expansion means the inputs themselves.
    assert neuralops_gqa.repeat_kv(k, 1) is k
    same_k, same_v = neuralops_gqa.gqa_expand(k, v, 2, 2)
    assert same_k is k and same_v is v


def test_meta_and_fake_tensors() -> None:
    k = torch.empty(3, 2, 7, 80, device="meta").transpose(1, 2).transpose(1, 2)
    v = torch.empty(3, 7, 2, 64, device="meta", dtype=torch.bfloat16).transpose(1, 2)
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, 2, 8)
    assert k_out.device.type == "meta" and v_out.dtype == torch.bfloat16
    assert k_out.shape == (3, 8, 7, 80) and v_out.shape == (3, 8, 7, 64)
    assert k_out.is_contiguous() and v_out.is_contiguous()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        g = torch.empty(3, 8, 7, 80)
        gk, gv = torch.ops.neuralops.gqa_reduce(g, g[..., :16], 2, 8)
        assert gk.shape == (3, 2, 7, 80) and gk.is_contiguous()
        assert gv.shape == (3, 2, 7, 16) and gv.is_contiguous()


@given(case=cases())
def test_fuzz_forward(backend: str, device: str, case: Case) -> None:
    k = make_tensor(
        (case.batch, case.kv_heads, case.seq, case.dim_k), case.dtype_k, case.layout_k, device, case.seed
    )
    v = make_tensor(
        (case.batch, case.kv_heads, case.seq, case.dim_v), case.dtype_v, case.layout_v, device, case.seed + 1
    )
    _check(k, v, case.n_rep)


@pytest.mark.parametrize("layout", ["window", "bnhd-window"])
def test_reads_stay_inside_the_view(backend: str, device: str, layout: str) -> None:
    """A view into a larger buffer full of guard values: no guard may reach the output."""
    guard = -12345.0
    buf = torch.full((3, 6, 40, 100), guard, device=device)
    if layout == "window":  # a KV-cache window: heads 1..4, positions 5..27, dims 10..89
        view = buf[:, 1:5, 5:28, 10:90]
    else:  # the same window of a [B, N, H, D] buffer, transposed
        view = buf.permute(0, 2, 1, 3)[:, 5:28, 1:5, 10:90].transpose(1, 2)
    view.copy_(torch.randn(view.shape, generator=torch.Generator().manual_seed(0)).to(device))
    k_out, v_out = torch.ops.neuralops.gqa_expand(view, view, 4, 12)
    assert not (k_out == guard).any() and not (v_out == guard).any()
    assert_bitwise_equal(k_out, expand_oracle(view, 3))
    grad = torch.full((3, 20, 40, 100), guard, device=device)
    grad_view = grad[:, 4:16, 5:28, 10:90]
    grad_view.copy_(torch.randn(grad_view.shape, generator=torch.Generator().manual_seed(1)).to(device))
    gk, _ = torch.ops.neuralops.gqa_reduce(grad_view, grad_view, 4, 12)
    assert (gk.abs() < 1000).all()


# Dtypes Triton has no pointer type for (or normalises): they travel as integers of their
# width. torch.uint16/32/64 and the bits types exist in every supported torch.
_BIT_DTYPES = [
    getattr(torch, name)
    for name in ("float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
                 "uint16", "uint32", "uint64", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint1", "uint4", "uint7",
                 "int1", "int4", "int7")
    if hasattr(torch, name)
]  # fmt: skip


@pytest.mark.parametrize("dtype", _BIT_DTYPES, ids=str)
def test_dtypes_copied_as_bits(backend: str, device: str, dtype: torch.dtype) -> None:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    bits = torch.randint(0, 127, (2, 3, 5, 6), generator=torch.Generator().manual_seed(0)).to(width)
    x = bits.to(device).view(dtype)
    k_out, v_out = torch.ops.neuralops.gqa_expand(x, x[..., :4], 3, 6)
    assert k_out.dtype == dtype and v_out.dtype == dtype
    assert torch.equal(k_out.view(width).cpu(), bits.repeat_interleave(2, 1))
    assert torch.equal(v_out.view(width).cpu(), bits[..., :4].repeat_interleave(2, 1))


# Dtypes Inductor generates no code for (a view or a copy of them fails there): the op keeps
# their expansion one opaque call in compiled graphs.
_NO_INDUCTOR_DTYPES = [torch.float8_e8m0fnu, torch.float4_e2m1fn_x2, torch.bits8, torch.bits16, torch.bits1x8,
                       torch.bits2x4, torch.bits4x2]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [*_NO_INDUCTOR_DTYPES, torch.float8_e4m3fn, torch.uint16], ids=str)
def test_dtypes_under_inductor(device: str, dtype: torch.dtype) -> None:
    """Every forward dtype the docs list compiles with Inductor and copies bit for bit."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]
    bits = torch.randint(0, 127, (2, 2, 3, 4), generator=torch.Generator().manual_seed(0)).to(width)
    x = bits.to(device).view(dtype)
    torch._dynamo.reset()
    compiled = torch.compile(lambda k: torch.ops.neuralops.gqa_expand(k, k, 2, 4), fullgraph=True)
    if dtype not in torch.fx.graph.dtype_abbrs:
        # torch 2.11: AOTAutograd prints every graph it compiles, and its printer has no name
        # for bits8, so any graph holding a bits8 tensor fails (docs/usage/limitations.md).
        with pytest.raises(Exception, match=str(dtype)):
            compiled(x)
        pytest.skip(f"{dtype} under torch.compile fails in torch {torch.__version__} itself (checked)")
    k_out, _ = compiled(x)
    assert k_out.dtype == dtype
    assert torch.equal(k_out.view(width).cpu(), bits.repeat_interleave(2, 1))


@pytest.mark.slow
def test_sub_byte_dtypes_under_torch_compile() -> None:
    """What docs/usage/limitations.md says: Inductor refuses them, with or without the op, and
    aot_eager compiles the op and copies bit for bit. In a fresh interpreter: pytest's log
    capture turns on graph printing, which fails on them before any backend runs."""
    code = """
import torch, neuralops_gqa
bits = torch.randint(0, 127, (2, 2, 3, 4), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
op = lambda k: torch.ops.neuralops.gqa_expand(k, k, 2, 4)
for name in ("uint1", "uint4", "uint7", "int1", "int4", "int7"):
    if not hasattr(torch, name):
        continue
    dtype = getattr(torch, name)
    for fn in (op, lambda k: k.clone()):
        torch._dynamo.reset()
        try:
            torch.compile(fn)(bits.view(dtype))
            raise AssertionError(f"{name}: Inductor compiled it")
        except torch._dynamo.exc.BackendCompilerFailed as e:
            assert "backend='inductor'" in str(e) and str(dtype) in str(e), e
    torch._dynamo.reset()
    k_out, _ = torch.compile(op, backend="aot_eager")(bits.view(dtype))
    assert k_out.dtype == dtype, name
    assert torch.equal(k_out.view(torch.uint8), bits.repeat_interleave(2, 1)), name
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]

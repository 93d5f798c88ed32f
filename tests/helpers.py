"""Tensor makers and comparisons shared by the tests (no fixtures, no test functions)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# torch 2.11's AOTInductor loader crashed the loading process (SIGSEGV) on the H200 image
# we test on, for CUDA packages (docs/verification/h200-aoti.log) and CPU ones (the docs'
# example): docs/usage/limitations.md.
AOTI_LOADER_CRASHES = torch.cuda.is_available() and torch.__version__.startswith("2.11.")

FORWARD_DTYPES = (
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    *FLOAT8,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.bool,
)
GRAD_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("contiguous", "bnhd", "offset", "step", "expanded", "permuted")

_SHORT = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
    torch.int8: "i8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "bool",
}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def short(dtype: torch.dtype) -> str:
    return _SHORT[dtype]


def case_id(b: int, kv: int, rep: int, n: int, d: int, dtype: torch.dtype, layout: str) -> str:
    """Test ids that read like shapes: ``B2-Hkv4-rep8-N33-D80-bf16-bnhd``."""
    return f"B{b}-Hkv{kv}-rep{rep}-N{n}-D{d}-{short(dtype)}-{layout}"


def random_values(shape: tuple[int, ...], dtype: torch.dtype, device: str, gen: torch.Generator) -> Tensor:
    """Random data of any supported dtype; never all zeros (zeros hide unwritten outputs)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool().to(device)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    return torch.randint(low, high, shape, generator=gen, dtype=torch.int64).to(device=device, dtype=dtype)


def make_tensor(
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    layout: str,
    device: str,
    seed: int = 0,
) -> Tensor:
    """A ``[B, H, N, D]`` tensor with the given memory layout.

    contiguous: packed. bnhd: a transposed ``[B, N, H, D]`` projection. offset: a window of
    a larger KV cache (storage offset, row stride > D). step: every other element of a
    wider buffer. expanded: stride 0 over batch and heads. permuted: stored ``[D, N, H, B]``.
    """
    gen = torch.Generator().manual_seed(seed)
    b, h, n, d = shape
    if layout == "contiguous":
        return random_values(shape, dtype, device, gen)
    if layout == "bnhd":
        return random_values((b, n, h, d), dtype, device, gen).transpose(1, 2)
    if layout == "offset":
        cache = random_values((b, h, n + 5, d + 3), dtype, device, gen)
        return cache[:, :, 3 : 3 + n, 1 : 1 + d]
    if layout == "step":
        return random_values((b, h, n, 2 * d), dtype, device, gen)[..., ::2]
    if layout == "expanded":
        return random_values((1, 1, n, d), dtype, device, gen).expand(b, h, n, d)
    if layout == "permuted":
        return random_values((d, n, h, b), dtype, device, gen).permute(3, 2, 1, 0)
    raise ValueError(f"unknown layout {layout!r}")


def assert_bitwise_equal(actual: Tensor, expected: Tensor) -> None:
    """Exact equality of the bits (NaN payloads and -0.0 included), shape and dtype."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    if actual.dtype == torch.bool:
        assert torch.equal(actual.cpu(), expected.cpu())
        return
    bits = _BITS[actual.element_size()]
    assert torch.equal(actual.cpu().view(bits), expected.cpu().view(bits))


def expand_oracle(x: Tensor, n_rep: int) -> Tensor:
    """What every backend must equal bit for bit: ``repeat_interleave`` on dim 1."""
    if x.dtype in FLOAT8 or x.dtype == torch.bool:
        return x.view(torch.uint8).repeat_interleave(n_rep, dim=1).view(x.dtype)
    return x.repeat_interleave(n_rep, dim=1)


def reduce_oracle(grad: Tensor, num_kv_heads: int) -> Tensor:
    """The group sums in float64, the yardstick for every backward."""
    return grad.double().unflatten(1, (num_kv_heads, grad.shape[1] // num_kv_heads)).sum(2)


def assert_reduce_close(actual: Tensor, grad: Tensor, num_kv_heads: int, op_output: bool = True) -> None:
    """Backward tolerance: one rounding to the output dtype (``eps`` relative) plus float32
    accumulation over ``n_rep`` terms (``n_rep * 2**-23 * max|grad|`` absolute; float64
    gradients accumulate in float64, so ``2**-52`` there)."""
    expected = reduce_oracle(grad, num_kv_heads)
    n_rep = grad.shape[1] // num_kv_heads
    acc_eps = 2.0**-52 if grad.dtype == torch.float64 else 2.0**-23
    scale = float(grad.abs().max()) if grad.numel() else 0.0
    assert actual.dtype == grad.dtype
    if op_output:  # autograd may re-stride .grad to match its leaf; the op's own outputs are packed
        assert actual.is_contiguous()
    torch.testing.assert_close(
        actual.double(),
        expected,
        rtol=torch.finfo(grad.dtype).eps,
        atol=2 * n_rep * acc_eps * scale + 1e-300,
    )


Expand = Callable[[Tensor, Tensor, int, int], tuple[Tensor, Tensor]]


class GQAttention(nn.Module):
    """Grouped-query attention as Llama/Mistral/Qwen2 write it (no RoPE), with the KV
    expansion pluggable: ``expand(k, v, kv_heads, heads) -> (k, v)``. ``sdpa=True`` attends
    with ``scaled_dot_product_attention`` (causal when no mask is given) instead of the
    eager matmul/softmax formulation."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, expand: Expand, sdpa: bool = False) -> None:
        super().__init__()
        self.sdpa = sdpa
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.dim, bias=False)
        self.o_proj = nn.Linear(heads * self.dim, hidden, bias=False)
        self.expand = expand

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.dim).transpose(1, 2)
        k, v = self.expand(k, v, self.kv_heads, self.heads)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
            return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.dim))
        scores = q @ k.transpose(2, 3) / math.sqrt(self.dim)
        if mask is not None:
            scores = scores + mask
        # Plain matmul attention: the eager formulation, and one DTensor shards by head.
        out = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.heads * self.dim))


def op_expand(k: Tensor, v: Tensor, kv_heads: int, heads: int) -> tuple[Tensor, Tensor]:
    """The registered op as a block's KV expansion."""
    return torch.ops.neuralops.gqa_expand(k, v, kv_heads, heads)  # type: ignore[no-any-return]


def interleave_expand(k: Tensor, v: Tensor, kv_heads: int, heads: int) -> tuple[Tensor, Tensor]:
    """The reference expansion: ``repeat_interleave`` on the head dim."""
    return k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)


def in_threads(work: Callable[[int], None], count: int) -> None:
    """Run ``work(0)`` ... ``work(count - 1)`` in threads that start together; fail with the
    first exceptions any thread raised (an exception in a thread would otherwise go unseen)."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            start.wait()
            work(index)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]


class RecordingMode(TorchDispatchMode):
    """A dispatch mode that lets every op through and records which ran (under it, every
    call of the ops takes the registered op's route)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))

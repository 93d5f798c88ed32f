"""The op in the CUDA runtime: current-stream launches, no host syncs, CUDA graph capture
of forward + backward, and calls from several threads at once."""

from __future__ import annotations

import pytest
import torch

from helpers import GQAttention, assert_bitwise_equal, expand_oracle, in_threads, interleave_expand, op_expand

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA streams, graphs and sync checks need a CUDA device"
)

EXPAND = torch.ops.neuralops.gqa_expand
REDUCE = torch.ops.neuralops.gqa_reduce


def _kv(seed: int, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device).manual_seed(seed)
    k = torch.randn(2, 4, 300, 128, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(2, 300, 4, 64, device=device, dtype=torch.float16, generator=gen).transpose(1, 2)
    return k, v


def test_launches_on_the_current_stream(backend: str) -> None:
    """The inputs are written on a side stream behind a long sleep; a launch on any other
    stream would read them before the write."""
    k, v = _kv(0)
    new_k, new_v = _kv(1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time before the writes
        k.copy_(new_k)
        v.copy_(new_v)
        k_out, v_out = EXPAND(k, v, 4, 16)
        g_k, g_v = REDUCE(k_out, v_out, 4, 16)
    torch.cuda.synchronize()
    assert_bitwise_equal(k_out, expand_oracle(new_k, 4))
    assert_bitwise_equal(v_out, expand_oracle(new_v, 4))
    # Exact although a sum is not a product: 2x, 3x and 4x of a bfloat16 or float16 value are
    # exact in the float32 accumulator, and 4x is exact in the dtype.
    torch.testing.assert_close(g_k, 4 * new_k, rtol=0, atol=0)
    torch.testing.assert_close(g_v, 4 * new_v, rtol=0, atol=0)


def test_no_host_synchronization(backend: str) -> None:
    k, v = (x.requires_grad_() for x in _kv(2))
    for sync_debug in ("default", "error"):  # the first round compiles the kernels
        torch.cuda.set_sync_debug_mode(sync_debug)
        try:
            k_out, v_out = EXPAND(k, v, 4, 16)
            torch.autograd.backward((k_out, v_out), (torch.ones_like(k_out), torch.ones_like(v_out)))
            REDUCE(k_out.detach(), v_out.detach(), 4, 16)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert k.grad is not None
    # Two rounds of four copies' gradients of ones: small integers, exact in any order.
    torch.testing.assert_close(k.grad, torch.full_like(k, 8.0), rtol=0, atol=0)


def test_cuda_graph_capture_forward_backward(backend: str) -> None:
    """A whole training step of an attention block captured by hand, replayed on new data
    copied into the same input buffer: outputs and gradients equal to eager."""
    torch.manual_seed(0)
    block = GQAttention(256, 8, 2, op_expand, sdpa=True).cuda()
    ref = GQAttention(256, 8, 2, interleave_expand, sdpa=True).cuda()
    ref.load_state_dict(block.state_dict())
    static_x = torch.randn(3, 64, 256, device="cuda", requires_grad=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (kernels compiled, allocator settled) off the capture
        for _ in range(3):
            block.zero_grad(set_to_none=True)
            static_x.grad = None
            block(static_x).square().sum().backward()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    block.zero_grad(set_to_none=True)
    static_x.grad = None
    with torch.cuda.graph(graph):
        static_out = block(static_x)
        static_out.square().sum().backward()

    for seed in range(3):
        x = torch.randn(3, 64, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        with torch.no_grad():
            static_x.copy_(x)
        graph.replay()
        x.requires_grad_()
        ref.zero_grad(set_to_none=True)
        out = ref(x)
        out.square().sum().backward()
        torch.testing.assert_close(static_out, out)
        assert static_x.grad is not None and x.grad is not None
        torch.testing.assert_close(static_x.grad, x.grad)
        for p, r in zip(block.parameters(), ref.parameters()):
            assert p.grad is not None and r.grad is not None
            torch.testing.assert_close(p.grad, r.grad)


def test_threads_each_on_its_own_stream(backend: str) -> None:
    """Eight threads, each on its own stream, call both ops on their own data at once."""

    def work(seed: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            k, v = _kv(seed)
            for _ in range(20):
                k_out, v_out = EXPAND(k, v, 4, 16)
                g_k, g_v = REDUCE(k_out, v_out, 4, 16)
            stream.synchronize()
            assert_bitwise_equal(k_out, expand_oracle(k, 4))
            assert_bitwise_equal(v_out, expand_oracle(v, 4))
            # Exact: the sum of four equal copies (see test_launches_on_the_current_stream).
            torch.testing.assert_close(g_k, 4 * k, rtol=0, atol=0)
            torch.testing.assert_close(g_v, 4 * v, rtol=0, atol=0)

    in_threads(work, 8)

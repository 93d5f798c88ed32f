"""The op's autograd kernel: its eager fast path must step aside for everything that wraps or
intercepts tensors, and forward-mode tangents must come out right."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from csrc_free_ops import private_internals
from helpers import RecordingMode, assert_bitwise_equal, expand_oracle, make_tensor, reduce_oracle


def test_dispatch_mode_sees_the_op(backend: str, device: str) -> None:
    k = make_tensor((2, 2, 3, 4), torch.float32, "contiguous", device)
    with RecordingMode() as rec:
        k_out, _ = torch.ops.neuralops.gqa_expand(k, k, 2, 4)
    assert "neuralops.gqa_expand.default" in rec.seen
    assert_bitwise_equal(k_out, expand_oracle(k, 2))


def test_vmap_and_functionalize(backend: str, device: str) -> None:
    kb = torch.randn(5, 2, 2, 3, 4, generator=torch.Generator().manual_seed(0)).to(device)
    out, _ = torch.vmap(lambda k, v: torch.ops.neuralops.gqa_expand(k, v, 2, 4))(kb, kb)
    assert_bitwise_equal(out, kb.repeat_interleave(2, dim=2))
    k = kb[0]
    fn = torch.func.functionalize(lambda k: torch.ops.neuralops.gqa_expand(k, k, 2, 6)[0])
    assert_bitwise_equal(fn(k), expand_oracle(k, 3))


def test_grad_mode_and_requires_grad_routing(backend: str, device: str) -> None:
    k = make_tensor((1, 2, 3, 4), torch.float32, "contiguous", device).requires_grad_()
    out, _ = torch.ops.neuralops.gqa_expand(k, k.detach(), 2, 4)
    assert out.grad_fn is not None
    with torch.no_grad():
        out, _ = torch.ops.neuralops.gqa_expand(k, k.detach(), 2, 4)
    assert out.grad_fn is None and not out.requires_grad
    assert_bitwise_equal(out, expand_oracle(k.detach(), 2))


def _linear_map(op: str, device: str):  # type: ignore[no-untyped-def]
    """One of the ops as a function of one float64 tensor (v a fixed multiple of k), its input
    and the oracle of its first output."""
    if op == "expand":
        k = make_tensor((1, 2, 2, 3), torch.float64, "contiguous", device)
        return (lambda x: torch.ops.neuralops.gqa_expand(x, 3 * x, 2, 4)), k, (lambda t: expand_oracle(t, 2))
    g = make_tensor((1, 4, 2, 3), torch.float64, "contiguous", device)
    return (lambda x: torch.ops.neuralops.gqa_reduce(x, 3 * x, 2, 4)), g, (lambda t: reduce_oracle(t, 2))


# Forward-mode AD through a custom op needs the op's own autograd kernel (docs/usage/limitations.md).
needs_fast_path = pytest.mark.skipif(
    not private_internals.ENABLED,
    reason=f"{private_internals.ENV}=0 turns off the autograd kernel that forward-mode AD needs",
)


@needs_fast_path
@pytest.mark.parametrize("op", ["expand", "reduce"])
def test_forward_mode_tangents(op: str, backend: str, device: str) -> None:
    # custom_op alone would return zero tangents here; both ops are linear, so the tangent of
    # each output is the op's own result on the tangent.
    fn, x, oracle = _linear_map(op, device)
    t = torch.randn_like(x)
    _, (t_a, t_b) = torch.func.jvp(fn, (x,), (t,))
    torch.testing.assert_close(t_a, oracle(t))
    torch.testing.assert_close(t_b, 3 * oracle(t))
    with fwAD.dual_level():
        out_a, _ = fn(fwAD.make_dual(x, t))
        torch.testing.assert_close(fwAD.unpack_dual(out_a).tangent, oracle(t))
    jac_fwd = torch.func.jacfwd(lambda x: fn(x)[0])(x)
    jac_rev = torch.autograd.functional.jacobian(lambda x: fn(x)[0], x, vectorize=True)
    assert jac_rev.abs().sum() > 0
    torch.testing.assert_close(jac_fwd, jac_rev)
    if backend == "torch":  # numerical differences call the op once per element: too slow interpreted
        assert torch.autograd.gradcheck(fn, (x.clone().requires_grad_(),), check_forward_ad=True)


def test_lazy_views_and_zero_tensors(backend: str, device: str) -> None:
    """Lazily negated and conjugated views and zero tensors are materialized by their own
    dispatch keys before the kernels read memory."""
    z = torch.randn(1, 2, 3, 4, dtype=torch.complex64, device=device)
    negated = z.conj().imag  # real values stored positive, read negated
    assert negated.is_neg()
    out, _ = torch.ops.neuralops.gqa_expand(negated, negated, 2, 4)
    assert_bitwise_equal(out, expand_oracle(negated.resolve_neg(), 2))
    grads = torch.randn(1, 4, 3, 4, dtype=torch.complex64, device=device).conj().imag
    assert grads.is_neg()
    for lazy, plain in zip(torch.ops.neuralops.gqa_reduce(grads, grads, 2, 4), (grads.resolve_neg(),) * 2):
        assert_bitwise_equal(lazy, torch.ops.neuralops.gqa_reduce(plain, plain, 2, 4)[0])
    zeros = torch._efficientzerotensor((1, 4, 3, 4), device=device)
    out_k, out_v = torch.ops.neuralops.gqa_reduce(zeros, zeros, 2, 4)
    assert not out_k.any() and not out_v.any()


@needs_fast_path
def test_forward_mode_through_inputs_that_require_grad(backend: str, device: str) -> None:
    """Tangents and a backward graph on the same inputs: forward-over-reverse and the
    backward of a dual computation both work."""
    lin = torch.nn.Linear(3, 3, dtype=torch.float64, device=device)
    x = make_tensor((1, 2, 2, 3), torch.float64, "contiguous", device)
    t = torch.randn_like(x)
    with fwAD.dual_level():
        k = lin(fwAD.make_dual(x, t))
        assert k.requires_grad
        out, _ = torch.ops.neuralops.gqa_expand(k, k, 2, 4)
        ref = lin(fwAD.make_dual(x, t)).repeat_interleave(2, 1)
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, fwAD.unpack_dual(ref).tangent)
        (grad_w,) = torch.autograd.grad(fwAD.unpack_dual(out).primal.sum(), lin.weight)
        (ref_w,) = torch.autograd.grad(fwAD.unpack_dual(ref).primal.sum(), lin.weight)
        torch.testing.assert_close(grad_w, ref_w)
    if backend == "torch":  # numerical differences call the op once per element: too slow interpreted
        for op, shape in (
            (torch.ops.neuralops.gqa_expand, (1, 2, 2, 3)),
            (torch.ops.neuralops.gqa_reduce, (1, 4, 2, 3)),
        ):
            a = make_tensor(shape, torch.float64, "contiguous", device).requires_grad_()
            b = make_tensor(shape, torch.float64, "bnhd", device).detach().requires_grad_()
            assert torch.autograd.gradgradcheck(
                lambda a, b, op=op: op(a, b, 2, 4), (a, b), check_fwd_over_rev=True
            )


@needs_fast_path
def test_forward_mode_with_an_integer_input(device: str) -> None:
    """jvp through v while k is an integer tensor: only v's output carries a tangent."""
    k = torch.randint(0, 9, (1, 2, 3, 4), device=device)
    v = torch.randn(1, 2, 3, 4, device=device, dtype=torch.float64)
    t = torch.randn_like(v)
    out, tangent = torch.func.jvp(lambda z: torch.ops.neuralops.gqa_expand(k, z, 2, 4)[1], (v,), (t,))
    torch.testing.assert_close(tangent, t.repeat_interleave(2, 1))
    assert torch.equal(out, v.repeat_interleave(2, 1))


@needs_fast_path
@pytest.mark.slow
@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
def test_forward_mode_under_compile_leaves_the_process_working(device: str, transform: str) -> None:
    torch._dynamo.reset()
    x = torch.randn(1, 2, 2, 3, device=device, dtype=torch.float64)
    t = torch.randn_like(x)

    def fn(z: torch.Tensor) -> torch.Tensor:
        return torch.ops.neuralops.gqa_expand(z, z, 2, 4)[0]  # type: ignore[no-any-return]

    if transform == "jvp":
        _, tangent = torch.compile(lambda x, t: torch.func.jvp(fn, (x,), (t,)), backend="aot_eager")(x, t)
        torch.testing.assert_close(tangent, t.repeat_interleave(2, 1))
    else:
        jac = torch.compile(torch.func.jacfwd(fn), backend="aot_eager")(x)
        torch.testing.assert_close(jac, torch.func.jacfwd(fn)(x))
    # Forward-mode AD still works afterwards in this process.
    _, tangent = torch.func.jvp(lambda z: z * 2, (x,), (t,))
    torch.testing.assert_close(tangent, 2 * t)

"""``torch.func`` transforms through the ops: the same values as through ``repeat_interleave``.

Both ops are linear, so every derivative is the ops themselves; in float64 the results
equal the reference transforms' to float64 rounding (the group sums may add in another
order), which is the tolerance below.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
from torch import Tensor
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap

from csrc_free_ops import private_internals
from helpers import GQAttention, assert_bitwise_equal, assert_reduce_close, interleave_expand, op_expand

EXPAND = torch.ops.neuralops.gqa_expand.default
REDUCE = torch.ops.neuralops.gqa_reduce.default
TOL = {"rtol": 1e-12, "atol": 1e-12}

needs_internals = pytest.mark.skipif(
    not private_internals.ENABLED,
    reason=f"{private_internals.ENV}=0: the op's own autograd kernel, which these transforms need, is off "
    "(test_reverse_transforms_without_internals_fail_clearly covers that case)",
)


def _expand_loss(x: Tensor) -> Tensor:
    k, v = EXPAND(x, x.cos(), 2, 4)
    return (k.pow(3) * v).sum() + v.sin().sum()


def _expand_loss_ref(x: Tensor) -> Tensor:
    k, v = x.repeat_interleave(2, 1), x.cos().repeat_interleave(2, 1)
    return (k.pow(3) * v).sum() + v.sin().sum()


def _reduce_loss(g: Tensor) -> Tensor:
    a, b = REDUCE(g.sin(), g * g, 1, 2)
    return a.pow(2).sum() + (a * b).sum()


def _reduce_loss_ref(g: Tensor) -> Tensor:
    a, b = (t.unflatten(1, (1, 2)).sum(2) for t in (g.sin(), g * g))
    return a.pow(2).sum() + (a * b).sum()


CASES = {"expand": (_expand_loss, _expand_loss_ref), "reduce": (_reduce_loss, _reduce_loss_ref)}


def _point(device: str) -> Tensor:
    # [B, H, N, D] small enough for a hessian: 8 elements.
    return torch.randn(1, 2, 2, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(device)


TRANSFORMS: dict[str, Callable[[Callable[[Tensor], Tensor]], Callable[[Tensor], object]]] = {
    "grad": grad,
    "grad_and_value": grad_and_value,
    "vjp": lambda f: lambda x: vjp(f, x)[1](torch.ones((), dtype=x.dtype, device=x.device)),
    "jvp": lambda f: lambda x: jvp(f, (x,), (torch.ones_like(x),)),
    "jacrev": jacrev,
    "jacfwd": jacfwd,
    "hessian": hessian,
    "jacrev(jacrev)": lambda f: jacrev(jacrev(f)),
    "jacfwd(jacfwd)": lambda f: jacfwd(jacfwd(f)),
}
# The second-order transforms compose the first-order rules, whichever kernels run below
# them. Where the Triton kernels are interpreted (a CPU: tens of ms a launch, and these
# transforms launch hundreds of times) the kernels run the first-order transforms and the
# reference all of them; on a GPU both run all of them.
_SECOND_ORDER = ("hessian", "jacrev(jacrev)", "jacfwd(jacfwd)")
BACKEND_TRANSFORMS = [
    (backend, transform)
    for backend in ("torch", "triton")
    for transform in TRANSFORMS
    if backend == "torch" or torch.cuda.is_available() or transform not in _SECOND_ORDER
]


@needs_internals
@pytest.mark.parametrize("op", CASES)
@pytest.mark.parametrize(("backend", "transform"), BACKEND_TRANSFORMS, indirect=["backend"])
def test_transform_matches_repeat_interleave(backend: str, device: str, op: str, transform: str) -> None:
    fn, ref = CASES[op]
    x = _point(device)
    actual, expected = TRANSFORMS[transform](fn)(x), TRANSFORMS[transform](ref)(x)
    torch.testing.assert_close(actual, expected, **TOL)


@needs_internals
@pytest.mark.parametrize("op", CASES)
@pytest.mark.parametrize(("backend", "transform"), BACKEND_TRANSFORMS, indirect=["backend"])
def test_vmap_over_transform(backend: str, device: str, op: str, transform: str) -> None:
    """Per-sample transforms: a vmapped dim over each sample's own input."""
    fn, ref = CASES[op]
    xs = torch.stack([_point(device), 2 * _point(device), -_point(device)])
    actual = vmap(TRANSFORMS[transform](fn))(xs)
    expected = vmap(TRANSFORMS[transform](ref))(xs)
    torch.testing.assert_close(actual, expected, **TOL)


@needs_internals
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copies_are_exact_and_sums_accumulate_in_float32(
    backend: str, device: str, dtype: torch.dtype
) -> None:
    """Where a transform's result is a copy (the expansion's tangents, the reduction's
    cotangents) it equals repeat_interleave's bit for bit; where it is a group sum (the
    expansion's cotangents, the reduction's tangents) it is the float32-accumulated sum."""
    gen = torch.Generator().manual_seed(0)
    k, v = (torch.randn(2, 2, 3, 8, generator=gen).to(device, dtype) for _ in range(2))  # 2 KV heads
    gk, gv = (torch.randn(2, 8, 3, 8, generator=gen).to(device, dtype) for _ in range(2))  # 8 heads

    _, (tk, tv) = jvp(lambda a, b: EXPAND(a, b, 2, 8), (k, v), (v, k))
    assert_bitwise_equal(tk, v.repeat_interleave(4, 1))
    assert_bitwise_equal(tv, k.repeat_interleave(4, 1))
    _, pull = vjp(lambda a, b: REDUCE(a, b, 2, 8), gk, gv)
    ck, cv = pull((k, v))
    assert_bitwise_equal(ck, k.repeat_interleave(4, 1))
    assert_bitwise_equal(cv, v.repeat_interleave(4, 1))

    _, pull = vjp(lambda a, b: EXPAND(a, b, 2, 8), k, v)
    sk, sv = pull((gk, gv))
    assert_reduce_close(sk, gk, 2, op_output=False)
    assert_reduce_close(sv, gv, 2, op_output=False)
    _, (rk, rv) = jvp(lambda a, b: REDUCE(a, b, 2, 8), (gk, gv), (gv, gk))
    assert_reduce_close(rk, gv, 2, op_output=False)
    assert_reduce_close(rv, gk, 2, op_output=False)


@needs_internals
def test_per_sample_gradients_of_an_attention_block(backend: str, device: str) -> None:
    """vmap(grad(loss)) over a batch, as differential privacy and influence functions use it:
    every parameter's per-sample gradient equals the repeat_interleave block's."""
    torch.manual_seed(0)
    block = GQAttention(32, 8, 2, op_expand, sdpa=True).to(device).double()
    ref = GQAttention(32, 8, 2, interleave_expand, sdpa=True).to(device).double()
    ref.load_state_dict(block.state_dict())
    params = {k: v.detach() for k, v in block.named_parameters()}
    x = torch.randn(4, 5, 32, dtype=torch.float64, device=device)

    def loss(module: torch.nn.Module) -> Callable[[dict[str, Tensor], Tensor], Tensor]:
        return lambda p, sample: functional_call(module, p, (sample[None],)).pow(2).sum()

    actual = vmap(grad(loss(block)), in_dims=(None, 0))(params, x)
    expected = vmap(grad(loss(ref)), in_dims=(None, 0))(params, x)
    assert actual.keys() == expected.keys()
    for name in actual:
        assert actual[name].shape == (4, *params[name].shape)
        torch.testing.assert_close(actual[name], expected[name], **TOL, msg=name)


@needs_internals
def test_integer_input_beside_a_differentiated_one(device: str) -> None:
    """grad and jvp through v while k is an integer tensor: k's output carries nothing."""
    k = torch.randint(0, 9, (1, 2, 3, 4), device=device)
    v = torch.randn(1, 2, 3, 4, device=device, dtype=torch.float64)
    g = grad(lambda z: EXPAND(k, z, 2, 4)[1].pow(2).sum())(v)
    torch.testing.assert_close(g, 4 * v, **TOL)
    _, tangent = jvp(lambda z: EXPAND(k, z, 2, 4)[1], (v,), (torch.ones_like(v),))
    torch.testing.assert_close(tangent, torch.ones(1, 4, 3, 4, dtype=torch.float64, device=device))


@pytest.mark.slow
def test_reverse_transforms_without_internals_fail_clearly() -> None:
    """With the private internals off, custom ops' own autograd (``register_autograd``) serves
    every call, and its autograd.Function can't run under torch.func's reverse-mode
    transforms: an error that says so, never a wrong gradient (docs/usage/limitations.md)."""
    code = textwrap.dedent(
        """
        import torch, neuralops_gqa
        x = torch.randn(1, 2, 2, 2, dtype=torch.float64)
        try:
            torch.func.grad(lambda a: torch.ops.neuralops.gqa_expand(a, a, 2, 4)[0].sum())(x)
        except RuntimeError as e:
            assert "setup_context" in str(e), e
            print("refused")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, private_internals.ENV: "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused" in result.stdout


@needs_internals
def test_transforms_over_an_empty_batch(backend: str, device: str) -> None:
    """vmap(grad) and vmap(jvp) over zero samples: empty results, no error (the class of
    ``vmap`` over a dim of size 0)."""
    xs = torch.zeros(0, 1, 2, 2, 2, dtype=torch.float64, device=device)
    assert vmap(grad(_expand_loss))(xs).shape == xs.shape
    _, tangents = vmap(lambda x: jvp(_expand_loss, (x,), (torch.ones_like(x),)))(xs)
    assert tangents.shape == (0,)

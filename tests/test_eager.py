"""The eager route of plain calls (``neuralops_gqa.eager``) against the registered op's route:
same bits, the same errors, results that are plain tensors, and a bounded host path."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

import csrc_free_ops
import neuralops_gqa
from csrc_free_ops import private_internals
from helpers import RecordingMode, assert_bitwise_equal, expand_oracle, make_tensor
from neuralops_gqa import eager

needs_internals = pytest.mark.skipif(
    not private_internals.ENABLED,
    reason=f"{private_internals.ENV}=0: there is no plain route, every call takes the registered op",
)


def _both_routes(fn: Callable[[], object]) -> tuple[object, object]:
    """``fn()`` on the plain route, then on the registered route (a dispatch mode forces it)."""
    plain = fn()
    with RecordingMode():
        registered = fn()
    return plain, registered


CASES = [
    ((2, 4, 5, 8), 3, torch.float32, "contiguous"),
    ((1, 2, 7, 80), 4, torch.bfloat16, "bnhd"),
    ((2, 1, 3, 64), 6, torch.float16, "offset"),
    ((3, 2, 4, 16), 2, torch.float64, "step"),
]
IDS = ["B2-Hkv4-rep3-N5-D8-f32-contiguous", "B1-Hkv2-rep4-N7-D80-bf16-bnhd", "B2-Hkv1-rep6-N3-D64-f16-offset",
       "B3-Hkv2-rep2-N4-D16-f64-step"]  # fmt: skip


@pytest.mark.parametrize(("shape", "n_rep", "dtype", "layout"), CASES, ids=IDS)
def test_plain_and_registered_routes_agree(
    backend: str, device: str, shape: tuple[int, int, int, int], n_rep: int, dtype: torch.dtype, layout: str
) -> None:
    """Forward bits, gradients and their bits, through ``gqa_expand``, ``repeat_kv`` and
    ``torch.ops``, whichever route a call takes."""
    kv = shape[1]
    k = make_tensor(shape, dtype, layout, device, seed=1)
    v = make_tensor((*shape[:3], 24), dtype, "contiguous", device, seed=2)
    grads = (make_tensor((shape[0], kv * n_rep, *shape[2:]), dtype, "contiguous", device, seed=3),
             make_tensor((shape[0], kv * n_rep, shape[2], 24), dtype, "bnhd", device, seed=4))  # fmt: skip

    def step(expand: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]) -> tuple[Tensor, ...]:
        kg, vg = k.detach().requires_grad_(), v.detach().requires_grad_()
        outs = expand(kg, vg)
        torch.autograd.backward(outs, grads)
        assert kg.grad is not None and vg.grad is not None
        return (*outs, kg.grad, vg.grad)

    entries = {
        "gqa_expand": lambda a, b: neuralops_gqa.gqa_expand(a, b, kv, kv * n_rep),
        "torch.ops": lambda a, b: torch.ops.neuralops.gqa_expand(a, b, kv, kv * n_rep),
        "repeat_kv": lambda a, b: (neuralops_gqa.repeat_kv(a, n_rep), neuralops_gqa.repeat_kv(b, n_rep)),
    }
    for expand in entries.values():
        plain, registered = _both_routes(lambda: step(expand))  # noqa: B023
        for a, b in zip(plain, registered):  # type: ignore[call-overload]
            assert_bitwise_equal(a, b)
        assert_bitwise_equal(plain[0], expand_oracle(k, n_rep))  # type: ignore[index]
    with torch.no_grad():
        plain, registered = _both_routes(lambda: torch.ops.neuralops.gqa_reduce(*grads, kv, kv * n_rep))
    for a, b in zip(plain, registered):  # type: ignore[call-overload]
        assert_bitwise_equal(a, b)


def _layout_kept(x: Tensor) -> tuple[int, ...]:
    """The strides a plain-route gradient of ``x`` must have: ``torch.empty_like``'s, which
    keeps a dense tensor's strides, where ``x``'s last dim is dense (or has one element,
    whose stride says nothing); contiguous otherwise."""
    if x.stride(3) == 1 or x.shape[3] == 1:
        return torch.empty_like(x).stride()
    return torch.empty(x.shape).stride()


@needs_internals
@pytest.mark.parametrize(
    ("k_layout", "v_layout"),
    [("bnhd", "bnhd"), ("bnhd", "contiguous"), ("offset", "bnhd"), ("step", "permuted")],
)
def test_plain_gradients_are_laid_out_like_their_inputs(
    backend: str, device: str, k_layout: str, v_layout: str
) -> None:
    """On the plain route each gradient takes its input's strides where the input is dense
    (a [B, N, H, D] projection's transposed view above all), and is contiguous otherwise;
    through every entry point, with the registered route's bits (its results contiguous)."""
    b, kv, n_rep, n = 2, 3, 4, 5
    k = make_tensor((b, kv, n, 80), torch.bfloat16, k_layout, device, seed=1)
    v = make_tensor((b, kv, n, 16), torch.float32, v_layout, device, seed=2)
    grads = (make_tensor((b, kv * n_rep, n, 80), torch.bfloat16, "contiguous", device, seed=3),
             make_tensor((b, kv * n_rep, n, 16), torch.float32, "bnhd", device, seed=4))  # fmt: skip
    entries = {
        "gqa_expand": lambda a, c: neuralops_gqa.gqa_expand(a, c, kv, kv * n_rep),
        "torch.ops": lambda a, c: torch.ops.neuralops.gqa_expand(a, c, kv, kv * n_rep),
        "repeat_kv": lambda a, c: (neuralops_gqa.repeat_kv(a, n_rep), neuralops_gqa.repeat_kv(c, n_rep)),
    }
    for name, expand in entries.items():
        for wanted in ((True, True), (True, False), (False, True)):

            def step() -> tuple[Tensor, ...]:
                inputs = [x.detach().requires_grad_(w) for x, w in zip((k, v), wanted)]  # noqa: B023
                outs = expand(*inputs)  # noqa: B023
                return torch.autograd.grad(
                    [o for o, w in zip(outs, wanted) if w],  # noqa: B023
                    [x for x in inputs if x.requires_grad],
                    [g for g, w in zip(grads, wanted) if w],  # noqa: B023
                )

            plain, registered = _both_routes(step)
            inputs = [x for x, w in zip((k, v), wanted) if w]
            for got, want, x in zip(plain, registered, inputs):  # type: ignore[call-overload]
                assert got.stride() == _layout_kept(x), (name, wanted)
                assert want.is_contiguous(), (name, wanted)
                assert_bitwise_equal(got, want)


@needs_internals
def test_plain_keys_are_learnt_only_where_a_fresh_tensor_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a plain tensor's dispatch keys are is learnt the first time it is asked. Asked
    first inside a ``torch.func`` transform or inference mode, the fresh tensor it learns
    from would be a wrapper or an inference tensor: ``repeat_kv`` then took a transform's
    wrapper for a plain tensor and read its data pointer (a crash under ``grad``, a false
    freed-storage error under ``functionalize``), and plain tensors were never learnt."""
    monkeypatch.setattr(eager, "_PLAIN_KEYS", set())  # a process that has learnt nothing yet
    monkeypatch.setattr(eager, "_LEARNT_DEVICES", set())
    x = make_tensor((1, 2, 3, 4), torch.float64, "contiguous", "cpu", seed=1)
    got = torch.func.grad(lambda t: neuralops_gqa.repeat_kv(t, 2).sin().sum())(x)
    want = torch.func.grad(lambda t: expand_oracle(t, 2).sin().sum())(x)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert_bitwise_equal(
        torch.func.functionalize(lambda t: neuralops_gqa.repeat_kv(t, 2))(x), expand_oracle(x, 2)
    )
    with torch.inference_mode():
        eager._plain_keys(torch.empty(0))
    assert eager._plain_keys(torch.empty(0))  # a normal tensor: plain, once asked outside
    freed = x.clone()
    freed.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="repeat_kv: hidden_states has 24 elements but no memory"):
        neuralops_gqa.repeat_kv(freed, 2)


@needs_internals
def test_a_head_dim_of_one_keeps_its_layout(backend: str, device: str) -> None:
    """Head dim 1 of a permuted dense tensor: its stride is not 1 but says nothing, so the
    gradient still takes the input's strides (``torch.empty_like``'s), with the registered
    route's bits."""
    x = make_tensor((2, 1, 5, 3), torch.float32, "contiguous", device, seed=1).permute(0, 3, 2, 1)
    assert x.shape == (2, 3, 5, 1) and x.stride(3) != 1 and not x.is_contiguous()
    grad = make_tensor((2, 6, 5, 1), torch.float32, "contiguous", device, seed=2)

    def step() -> tuple[Tensor, ...]:
        leaf = x.detach().requires_grad_()
        return torch.autograd.grad(neuralops_gqa.repeat_kv(leaf, 2), leaf, grad)

    (plain,), (registered,) = _both_routes(step)  # type: ignore[misc]
    assert plain.stride() == torch.empty_like(x).stride() == x.stride()
    assert_bitwise_equal(plain, registered)


@needs_internals
@pytest.mark.parametrize("entry", ["gqa_expand", "repeat_kv"])
def test_a_projections_backward_reads_the_reduced_gradient_in_place(
    backend: str, device: str, entry: str
) -> None:
    """k and v as attention layers make them, ``proj(x).view(B, N, H, D).transpose(1, 2)``:
    the gradient that reaches each projection's output is the reduction's result itself,
    viewed, not a copy of it."""
    b, n, kv, n_rep, d = 2, 6, 2, 3, 8
    x = make_tensor((1, b, n, 16), torch.float32, "contiguous", device, seed=1)[0]
    k_proj = torch.nn.Linear(16, kv * d, bias=False, device=device)
    v_proj = torch.nn.Linear(16, kv * d, bias=False, device=device)
    seen: dict[str, Tensor] = {}

    def watched(name: str, y: Tensor) -> Tensor:
        y.register_hook(lambda g: seen.__setitem__(f"{name}_out", g))
        heads = y.view(b, n, kv, d).transpose(1, 2)
        heads.register_hook(lambda g: seen.__setitem__(name, g))
        return heads

    k, v = watched("k", k_proj(x)), watched("v", v_proj(x))
    if entry == "gqa_expand":
        out_k, out_v = neuralops_gqa.gqa_expand(k, v, kv, kv * n_rep)
    else:
        out_k, out_v = neuralops_gqa.repeat_kv(k, n_rep), neuralops_gqa.repeat_kv(v, n_rep)
    (out_k.square().sum() + out_v.sum()).backward()
    for name in ("k", "v"):
        assert seen[name].transpose(1, 2).is_contiguous()
        assert seen[f"{name}_out"].data_ptr() == seen[name].data_ptr()
    assert k_proj.weight.grad is not None and v_proj.weight.grad is not None


@pytest.mark.parametrize("route", ["plain", "registered"])
@pytest.mark.parametrize("entry", ["gqa_expand", "torch.ops", "repeat_kv", "gqa_reduce"])
def test_results_can_be_modified_in_place(backend: str, device: str, route: str, entry: str) -> None:
    """Every result is a new tensor that is no view, so in-place scaling under autograd works
    (rotary embeddings or a scale applied to the expanded keys), with the right gradient."""
    k = make_tensor((1, 2, 3, 4), torch.float64, "contiguous", device, seed=1).requires_grad_()
    v = make_tensor((1, 2, 3, 4), torch.float64, "bnhd", device, seed=2).requires_grad_()
    calls = {
        "gqa_expand": lambda: neuralops_gqa.gqa_expand(k, v, 2, 6)[0],
        "torch.ops": lambda: torch.ops.neuralops.gqa_expand(k, v, 2, 6)[0],
        "repeat_kv": lambda: neuralops_gqa.repeat_kv(k, 3),
        "gqa_reduce": lambda: torch.ops.neuralops.gqa_reduce(
            k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), 2, 6
        )[0],
    }
    mode = RecordingMode() if route == "registered" else None
    if mode is not None:
        mode.__enter__()
    try:
        out = calls[entry]()
        assert not out._is_view()
        out.mul_(3)
        out.sum().backward()
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)
    assert k.grad is not None
    # d(sum(3 * expand(k)))/dk = 3 * n_rep; for the reduction of an expansion, 3 * n_rep too.
    torch.testing.assert_close(k.grad, torch.full_like(k, 9.0), rtol=0, atol=0)


def test_modes_profilers_and_traces_see_the_op(device: str) -> None:
    """Where something watches, the Python entry points call the registered op."""
    k = make_tensor((1, 2, 3, 4), torch.float32, "contiguous", device)
    with RecordingMode() as mode:
        neuralops_gqa.gqa_expand(k, k, 2, 4)
        neuralops_gqa.repeat_kv(k, 2)
    assert mode.seen.count("neuralops.gqa_expand.default") == 2
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        neuralops_gqa.gqa_expand(k, k, 2, 4)
    assert any(event.name == "neuralops::gqa_expand" for event in prof.events())
    graph = torch.fx.symbolic_trace(lambda x: neuralops_gqa.repeat_kv(x, 2) * 2)
    assert_bitwise_equal(graph(k), expand_oracle(k, 2) * 2)
    assert any(node.target is neuralops_gqa.repeat_kv for node in graph.graph.nodes)
    graph = torch.fx.symbolic_trace(lambda x: neuralops_gqa.gqa_expand(x, x, 2, 4)[1])
    assert_bitwise_equal(graph(k), expand_oracle(k, 2))


_OURS = (os.path.dirname(neuralops_gqa.__file__), os.path.dirname(csrc_free_ops.__file__))


@contextmanager
def _python_calls() -> Iterator[list[str]]:
    """Our Python functions called while the block runs (torch's own frames, the same for
    Hugging Face's repeat_kv and different in each torch release, are not counted)."""
    calls: list[str] = []

    def profiler(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_filename.startswith(_OURS):
            calls.append(f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_code.co_name}")

    sys.setprofile(profiler)
    try:
        yield calls
    finally:
        sys.setprofile(None)


# The host path's budget in Python function calls of ours (on the CPU reference: the guard,
# the cached entry, the launch), deterministic where a wall clock is not. A change that adds
# frames to every eager call fails here; raise a budget only with a measurement of what
# the frames cost.
_BUDGETS = {"gqa_expand": 10, "repeat_kv": 8, "torch.ops": 7, "forward and backward": 21}


@needs_internals
def test_eager_calls_stay_within_their_python_call_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURALOPS_GQA_BACKEND", "torch")
    k = torch.randn(1, 2, 3, 4)
    kg = k.clone().requires_grad_()
    grad = torch.randn(1, 4, 3, 4)
    calls = {
        "gqa_expand": lambda: neuralops_gqa.gqa_expand(k, k, 2, 4),
        "repeat_kv": lambda: neuralops_gqa.repeat_kv(k, 2),
        "torch.ops": lambda: torch.ops.neuralops.gqa_expand(k, k, 2, 4),
        "forward and backward": lambda: torch.autograd.backward(
            neuralops_gqa.gqa_expand(kg, kg, 2, 4), (grad, grad)
        ),
    }
    counts = {}
    for name, call in calls.items():
        call()  # the first call of a layout checks it and caches its launch
        with _python_calls() as seen:
            call()
        counts[name] = len(seen)
        assert len(seen) <= _BUDGETS[name], (name, seen)
    assert counts["repeat_kv"] < counts["gqa_expand"]  # one tensor launched, not a pair


@needs_internals
@pytest.mark.parametrize("consumer", ["sdpa", "eager"])
@pytest.mark.parametrize("expansion", ["neuralops_repeat_kv", "neuralops_gqa_expand"])
def test_training_steps_of_an_attention_block_reuse_their_launches(
    backend: str, device: str, consumer: str, expansion: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first step, an eager training step of the attention benchmark's blocks checks
    no layout again: each gradient layout autograd hands the backward (k's arrives transposed
    behind the eager matmul) finds the launch the first step cached."""
    from benchmarks.attention import block

    made: list[str] = []
    new_entry = eager._new_entry

    def recording(op, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(op)
        return new_entry(op, *args, **kwargs)

    monkeypatch.setattr(eager, "_ENTRIES", {})  # what earlier tests cached is not this block's
    monkeypatch.setattr(eager, "_new_entry", recording)
    attention = block(consumer, expansion)
    q = make_tensor((1, 8, 16, 8), torch.float32, "contiguous", device, seed=1).requires_grad_()
    k, v = (
        make_tensor((1, 2, 16, 8), torch.float32, "contiguous", device, seed=s).requires_grad_()
        for s in (2, 3)
    )
    grad = make_tensor((1, 8, 16, 8), torch.float32, "contiguous", device, seed=4)
    first = torch.autograd.grad(attention(q, k, v), (q, k, v), grad)
    assert "gqa_expand" in made and "gqa_reduce" in made, made
    made_by_first = len(made)
    for _ in range(3):
        later = torch.autograd.grad(attention(q, k, v), (q, k, v), grad)
        for a, b in zip(first, later):
            assert_bitwise_equal(a, b)
    assert len(made) == made_by_first, made[made_by_first:]


@needs_internals
def test_backend_variable_takes_effect_on_the_next_call(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is part of the cached launch's key: no call is served the old backend."""
    from csrc_free_ops import gqa_triton  # needs triton; the backend fixture is not used here

    launched: list[str] = []
    real = gqa_triton.expand_launch

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        launched.append("triton")
        return real(*args, **kwargs)

    monkeypatch.setattr(gqa_triton, "expand_launch", recording)
    k = make_tensor((1, 3, 2, 8), torch.float32, "contiguous", device)
    for variable in ("torch", "triton", "torch", "bogus"):
        monkeypatch.setenv("NEURALOPS_GQA_BACKEND", variable)
        if variable == "bogus":
            with pytest.raises(ValueError, match="NEURALOPS_GQA_BACKEND must be one of"):
                neuralops_gqa.gqa_expand(k, k, 3, 6)
            continue
        before = len(launched)
        assert_bitwise_equal(neuralops_gqa.gqa_expand(k, k, 3, 6)[0], expand_oracle(k, 2))
        assert (len(launched) > before) == (variable == "triton"), variable


@pytest.mark.parametrize(
    "heads",
    [(2.0, 2.0), (2.0, 4), ("2", "2"), (True, True), (2, None), (2, torch.tensor(4.7)), (torch.tensor(2.0), 4),
     (2, np.float64(4.0)), (np.True_, 2), (torch.tensor(True), 2)],
)  # fmt: skip
def test_head_counts_must_be_integers(device: str, heads: tuple[object, object]) -> None:
    """A float (a float tensor too, which the dispatcher's parser would truncate), a string,
    a bool or None as a head count is a TypeError naming it, also where there is nothing to
    expand (the Python entry points would return the inputs there)."""
    k = make_tensor((1, 2, 3, 4), torch.float32, "contiguous", device)
    with pytest.raises(TypeError, match=r"gqa_expand: num_(kv_)?heads must be an int"):
        neuralops_gqa.gqa_expand(k, k, *heads)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"repeat_kv: n_rep must be an int"):
        neuralops_gqa.repeat_kv(k, heads[1] if isinstance(heads[0], int) else heads[0])  # type: ignore[arg-type]


def test_integer_head_counts_of_other_types_are_their_ints(device: str) -> None:
    """What PyTorch takes for an int argument (``operator.index``: a numpy integer, a
    one-element integer tensor) is that int on every entry point, as Hugging Face's
    ``repeat_kv`` takes it; compiled too from torch 2.13, where the wrappers branch on the
    int, not on a numpy scalar dynamo would trace as a tensor."""
    k = make_tensor((1, 2, 3, 4), torch.float32, "contiguous", device)
    want = expand_oracle(k, 3)
    for kv_heads, heads in ((np.int64(2), np.int32(6)), (torch.tensor(2), torch.tensor([6]))):
        for got in neuralops_gqa.gqa_expand(k, k, kv_heads, heads):  # type: ignore[arg-type]
            assert_bitwise_equal(got, want)
        assert_bitwise_equal(neuralops_gqa.repeat_kv(k, heads // kv_heads), want)  # type: ignore[arg-type]
    n_rep, kv_heads, heads = np.int64(3), np.int64(2), np.int64(6)

    def block(x: Tensor) -> Tensor:
        return neuralops_gqa.gqa_expand(x, x, kv_heads, heads)[0] + neuralops_gqa.repeat_kv(x, n_rep)  # type: ignore[arg-type]

    compiled = torch.compile(block, backend="eager", fullgraph=True)
    if torch.__version__ >= "2.13":
        assert_bitwise_equal(compiled(k), want + want)
    else:  # torch 2.11's dynamo traces a numpy integer as a tensor, and operator.index of one not at all
        with pytest.raises(torch._dynamo.exc.Unsupported, match="index"):
            compiled(k)


def test_repeat_kv_of_no_kv_heads_is_the_empty_input(device: str) -> None:
    """Zero KV heads: Hugging Face's ``repeat_kv`` returns an empty ``[B, 0, N, D]``, so ours
    does (its input, as for ``n_rep == 1``), not an error about the op's ``num_kv_heads``."""
    x = make_tensor((2, 0, 3, 4), torch.float32, "contiguous", device)
    for n_rep in (1, 2, 5):
        assert neuralops_gqa.repeat_kv(x, n_rep) is x


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_nested_tensors_are_refused_by_name(device: str) -> None:
    """Strided and jagged nested tensors: a ValueError naming the argument, not the
    dispatcher's NotImplementedError or an internal error about sizes."""
    parts = [torch.randn(2, 3, 4, device=device), torch.randn(2, 5, 4, device=device)]
    for layout in (torch.strided, torch.jagged):
        try:
            nested = torch.nested.nested_tensor(parts, layout=layout)
        except RuntimeError as e:  # a torch without this layout on this device
            pytest.skip(f"torch.nested.nested_tensor(layout={layout}) fails here: {e}")
        if layout == torch.strided or private_internals.ENABLED:
            # Jagged ones need the private class for the op's rule (docs/usage/limitations.md).
            with pytest.raises(ValueError, match="nested"):
                torch.ops.neuralops.gqa_expand(nested, nested, 2, 4)
        with pytest.raises(ValueError, match="repeat_kv: hidden_states must be a dense tensor"):
            neuralops_gqa.repeat_kv(nested, 2)


class _Subclass(Tensor):
    pass


class _DispatchSubclass(Tensor):
    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _swapped_to_tensor(x: Tensor) -> Tensor:
    """``x`` with its class set to ``Tensor``: the Python dispatch key stays on it."""
    x.__class__ = Tensor
    return x


@needs_internals
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
def test_the_guard_takes_plain_tensors_only(device: str) -> None:
    """Which tensors the eager route's guard calls plain, on every kind of tensor a call
    could be given: dense strided CPU or CUDA tensors, whatever their strides, dtype or
    autograd state; never a subclass, a lazy bit, another layout or device, or a wrapper of
    functionalization or of a ``torch.func`` or legacy vmap transform (which look like a
    plain ``Tensor`` to Python)."""
    from torch._vmap_internals import _vmap

    base = torch.randn(2, 4, 3, 8, device=device)
    z = torch.randn(2, 4, 3, 8, dtype=torch.complex64, device=device)
    with torch.inference_mode():
        inference = torch.randn(2, 4, 3, 8, device=device)
    escaped: list[Tensor] = []
    torch.func.vmap(lambda x: escaped.append(x) or x)(base)
    torch.func.grad(lambda x: escaped.append(x) or x.sum())(base)
    _vmap(lambda x: escaped.append(x) or x, 0, 0)(base)
    tensors = {
        "contiguous": base,
        "transposed": base.transpose(1, 2),
        "sliced": base[:, 1:],
        "expanded": base[:, :1].expand(2, 4, 3, 8),
        "requires grad": base.clone().requires_grad_(),
        "non-leaf": base.clone().requires_grad_() * 2,
        "int": base.int(),
        "bool": base > 0,
        "inference": inference,
        "complex": z,
        "conjugate": z.conj(),
        "negative": z.conj().imag,
        "zero tensor": torch._efficientzerotensor((2, 4, 3, 8), device=device),
        "sparse": base.to_sparse(),
        "sparse csr": base[0, 0].to_sparse_csr(),
        "nested": torch.nested.nested_tensor([base[0], base[1]]),
        "subclass": base.as_subclass(_Subclass),
        "dispatch subclass, class swapped to Tensor": _swapped_to_tensor(base.as_subclass(_DispatchSubclass)),
        "jagged nested": torch.nested.nested_tensor([base[0], base[1, :, :2]], layout=torch.jagged),
        "parameter": torch.nn.Parameter(base),
        "functionalization wrapper": torch._to_functional_tensor(base),
        "torch.func.vmap's wrapper": escaped[0],
        "torch.func.grad's wrapper": escaped[1],
        "legacy vmap's wrapper": escaped[2],
        "meta": base.to("meta"),
        # A null data pointer: an empty tensor's, or a functionalization wrapper's of any size.
        "empty": base[:0],
        "empty, fresh": torch.empty(0, 4, 3, 8, device=device),
        "empty functionalization wrapper": torch._to_functional_tensor(base[:0]),
    }
    if device == "cpu":
        tensors["quantized"] = torch.quantize_per_tensor(base, 0.1, 0, torch.qint8)
    plain = [name for name, t in tensors.items() if eager._plain_tensor(t)]
    assert plain == [
        "contiguous", "transposed", "sliced", "expanded", "requires grad", "non-leaf", "int", "bool", "inference",
        "complex", "empty", "empty, fresh",
    ]  # fmt: skip


def test_a_wrapper_that_escaped_its_transform_still_expands(device: str) -> None:
    """A tensor kept from inside ``torch.func.grad`` is a wrapper with no storage: ATen ops
    still take it, and so do the entry points (through the registered op)."""
    escaped: list[Tensor] = []
    k = make_tensor((1, 2, 3, 4), torch.float32, "contiguous", device)
    torch.func.grad(lambda x: escaped.append(x) or x.sum())(k)
    (wrapper,) = escaped
    oracle = expand_oracle(k, 2)
    assert_bitwise_equal(neuralops_gqa.repeat_kv(wrapper, 2), oracle)
    for out in neuralops_gqa.gqa_expand(wrapper, wrapper, 2, 4):
        assert_bitwise_equal(out, oracle)

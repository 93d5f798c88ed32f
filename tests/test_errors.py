"""Bad input: always a clear ValueError/RuntimeError naming the argument, eager and compiled."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import DEVICE
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import neuralops_gqa
from csrc_free_ops import private_internals
from neuralops_gqa.backend import BACKEND_ENV

EXPAND = torch.ops.neuralops.gqa_expand
REDUCE = torch.ops.neuralops.gqa_reduce


def _t(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    return torch.ones(shape, dtype=dtype, device=device)


# (id, op, args builder, the words the message must contain)
BAD: list[tuple[str, Any, Callable[[], tuple], str]] = [
    ("not-multiple", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, 30), r"num_heads \(30\).*multiple.*num_kv_heads \(4\)"),
    ("zero-kv-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 0, 8), "num_kv_heads must be positive"),
    ("negative-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, -8), "num_heads must be positive"),
    ("zero-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, 0), "num_heads must be positive, got 0"),
    ("k-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 2, 8), r"k.shape\[1\] \(4\) must equal num_kv_heads \(2\)"),
    ("batch", EXPAND, lambda: (_t(1, 4, 2, 8), _t(2, 4, 2, 8), 4, 8), "k and v must agree in the batch"),
    ("v-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 2, 2, 8), 4, 8), "k and v must agree in the head"),
    ("seq", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 3, 8), 4, 8), "k and v must agree in the sequence"),
    ("k-3d", EXPAND, lambda: (_t(4, 2, 8), _t(1, 4, 2, 8), 4, 8), r"k must be 4-D"),
    ("v-5d", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 1, 4, 2, 8), 4, 8), r"v must be 4-D"),
    ("complex", EXPAND, lambda: (_t(1, 4, 2, 8, dtype=torch.complex64), _t(1, 4, 2, 8), 4, 8), "k must have a real dtype"),
    ("sparse", EXPAND, lambda: (_t(1, 4, 2, 8).to_sparse(), _t(1, 4, 2, 8), 4, 8), "k must be a dense tensor"),
    ("quantized", EXPAND, lambda: (_t(1, 4, 2, 8), torch.quantize_per_tensor(_t(1, 4, 2, 8), 0.1, 0, torch.qint8), 4, 8), "v must be a dense tensor"),
    ("devices", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8, device="meta"), 4, 8), "k and v must be on one device"),
    ("grad-int", REDUCE, lambda: (_t(1, 8, 2, 8, dtype=torch.int32), _t(1, 8, 2, 8), 4, 8), "grad_k must be float16, bfloat16"),
    ("grad-heads", REDUCE, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, 8), r"grad_k.shape\[1\] \(4\) must equal num_heads \(8\)"),
    ("grad-seq", REDUCE, lambda: (_t(1, 8, 2, 8), _t(1, 8, 5, 8), 4, 8), "grad_k and grad_v must agree in the sequence"),
]  # fmt: skip


@pytest.mark.parametrize(("op", "make_args", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_eager(backend: str, op: Any, make_args: Callable[[], tuple], message: str) -> None:
    with pytest.raises((ValueError, RuntimeError), match=message):
        op(*make_args())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("op", "make_args", "message"), [b[1:] for b in BAD[:4]], ids=[b[0] for b in BAD[:4]]
)
def test_compiled(op: Any, make_args: Callable[[], tuple], message: str) -> None:
    """The fake implementation checks the same things, so tracing fails with the same words."""
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: op(*a), fullgraph=True, backend="eager")
    with pytest.raises((ValueError, RuntimeError), match=message):
        fn(*make_args())


def test_non_tensor_arguments() -> None:
    with pytest.raises((TypeError, RuntimeError), match="v"):
        EXPAND(_t(1, 4, 2, 8), "v", 4, 8)
    with pytest.raises((TypeError, RuntimeError), match="num_heads"):
        EXPAND(_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, 8.5)


def test_wrappers() -> None:
    with pytest.raises(ValueError, match="n_rep must be a positive int"):
        neuralops_gqa.repeat_kv(_t(1, 4, 2, 8), 0)
    with pytest.raises(ValueError, match="hidden_states must be 4-D"):
        neuralops_gqa.repeat_kv(_t(4, 2, 8), 2)
    with pytest.raises(ValueError, match="k and v must agree"):
        neuralops_gqa.gqa_expand(_t(1, 4, 2, 8), _t(1, 4, 3, 8), 4, 4)


def test_backend_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "cuda-please")
    with pytest.raises(ValueError, match=f"{BACKEND_ENV} must be one of auto, triton, torch"):
        EXPAND(_t(1, 1, 2, 8), _t(1, 1, 2, 8), 1, 2)


def test_triton_on_cpu_needs_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="needs TRITON_INTERPRET=1"):
        EXPAND(_t(1, 1, 2, 8), _t(1, 1, 2, 8), 1, 2)


# Devices a call may mix: the test device, meta, and the CPU next to a GPU.
_DEVICES = [DEVICE, "meta"] + (["cpu"] if DEVICE != "cpu" else [])


def _device_still_works() -> None:
    """A failed call must leave the device usable (no sticky CUDA error)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        assert torch.ones(4, device=DEVICE).add(1).sum().item() == 8


@st.composite
def _bad_calls(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Mostly-valid calls with one thing broken (or several)."""
    rank_k = draw(st.sampled_from([4, 4, 4, 2, 3, 5]))
    rank_v = draw(st.sampled_from([4, 4, 4, 3, 5]))
    kv = draw(st.integers(-2, 5))
    heads = draw(st.integers(-4, 20))
    shape = [
        draw(st.integers(0, 3)),
        draw(st.integers(1, 5)),
        draw(st.integers(0, 4)),
        draw(st.integers(1, 8)),
    ]
    shape_v = list(shape)
    if draw(st.booleans()):
        shape_v[draw(st.integers(0, 2))] += draw(st.integers(1, 2))
    dtypes = [torch.float32, torch.bfloat16, torch.complex64, torch.int16, torch.bool]
    dtype_k = draw(st.sampled_from(dtypes))
    dtype_v = draw(st.one_of(st.just(torch.float32), st.sampled_from(dtypes)))
    device_k = draw(st.one_of(st.just(DEVICE), st.sampled_from(_DEVICES)))
    device_v = draw(st.one_of(st.just(device_k), st.sampled_from(_DEVICES)))
    k = torch.zeros((shape + [1] * 4)[:rank_k], dtype=dtype_k, device=device_k)
    v = torch.zeros((shape_v + [1] * 4)[:rank_v], dtype=dtype_v, device=device_v)
    return k, v, kv, heads


def _is_valid(k: torch.Tensor, v: torch.Tensor, kv: int, heads: int) -> bool:
    return (
        k.dim() == 4
        and v.dim() == 4
        and not k.dtype.is_complex
        and not v.dtype.is_complex
        and k.device == v.device
        and kv > 0
        and heads > 0
        and heads % kv == 0
        and k.shape[1] == kv
        and k.shape[:3] == v.shape[:3]
    )


_CLEAR_ERROR = r"gqa_expand: (k|v|num_heads|num_kv_heads)"


@given(call=_bad_calls())
def test_fuzz_bad_inputs(backend: str, call: tuple[torch.Tensor, torch.Tensor, int, int]) -> None:
    """Every call either succeeds with the right shape or raises a clear error; nothing else."""
    k, v, kv, heads = call
    if _is_valid(k, v, kv, heads):
        k_out, v_out = EXPAND(k, v, kv, heads)
        assert k_out.shape == (k.shape[0], heads, k.shape[2], k.shape[3])
        assert v_out.shape == (v.shape[0], heads, v.shape[2], v.shape[3])
    else:
        with pytest.raises((ValueError, RuntimeError), match=_CLEAR_ERROR):
            EXPAND(k, v, kv, heads)
    _device_still_works()


@pytest.mark.slow
@settings(max_examples=15)
@given(call=_bad_calls())
def test_fuzz_bad_inputs_compiled(call: tuple[torch.Tensor, torch.Tensor, int, int]) -> None:
    """The same bad calls, traced by ``torch.compile``: the fake implementation's checks raise
    the same clear errors at trace time."""
    k, v, kv, heads = call
    assume(not _is_valid(k, v, kv, heads))
    torch._dynamo.reset()  # each example traces afresh, never falling back to eager
    fn = torch.compile(lambda k, v: EXPAND(k, v, kv, heads), fullgraph=True, backend="aot_eager")
    with pytest.raises((ValueError, RuntimeError), match=_CLEAR_ERROR):
        fn(k, v)
    _device_still_works()


_NOT_TENSORS = [None, 3, 2.5, "k", [1.0, 2.0], (1, 4, 2, 8)]


@given(
    which=st.sampled_from(["k", "v", "num_kv_heads", "num_heads"]),
    value=st.sampled_from([*_NOT_TENSORS, torch.ones(2), torch.ones(1, dtype=torch.int64)]),
)
def test_fuzz_wrong_argument_types(which: str, value: object) -> None:
    """Wrong argument types raise a TypeError/RuntimeError that names the argument."""
    args = {
        "k": _t(1, 4, 2, 8, device=DEVICE),
        "v": _t(1, 4, 2, 8, device=DEVICE),
        "num_kv_heads": 4,
        "num_heads": 8,
    }
    if which in ("k", "v") and isinstance(value, torch.Tensor):
        value = None  # a tensor is the right type for k and v
    args[which] = value
    # The schema's own message quotes the whole signature: ask for the argument's own words.
    with pytest.raises(
        (TypeError, RuntimeError, ValueError), match=rf"argument '{which}'|gqa_expand: .*\b{which}\b"
    ):
        EXPAND(*args.values())
    _device_still_works()


def test_backend_variable_is_normalised_and_checked_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Case and blanks don't matter; a bad value fails every call: eager, on meta tensors,
    on the wrapper's n_rep == 1 path and at trace time, not only where a kernel runs."""
    k = _t(1, 2, 3, 4)
    monkeypatch.setenv(BACKEND_ENV, " Torch\n")
    assert EXPAND(k, k, 2, 4)[0].shape == (1, 4, 3, 4)
    monkeypatch.setenv(BACKEND_ENV, "cuda-please")
    calls = {
        "eager": lambda: EXPAND(k, k, 2, 4),
        "meta": lambda: EXPAND(k.to("meta"), k.to("meta"), 2, 4),
        "n_rep-1": lambda: neuralops_gqa.gqa_expand(k, k, 2, 2),
        "compiled": lambda: torch.compile(lambda a: EXPAND(a, a, 2, 4), backend="aot_eager")(k),
    }
    for name, call in calls.items():
        torch._dynamo.reset()
        with pytest.raises((ValueError, RuntimeError), match=f"{BACKEND_ENV} must be one of"):
            call()
            pytest.fail(f"{name}: no error")


def test_repeat_kv_checks_whatever_n_rep() -> None:
    x = _t(1, 2, 3, 4)
    for n_rep in (1, 2):
        with pytest.raises(TypeError, match="repeat_kv: hidden_states must be a Tensor, got NoneType"):
            neuralops_gqa.repeat_kv(None, n_rep)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"hidden_states must be 4-D .* got shape \(2, 3, 4\)"):
            neuralops_gqa.repeat_kv(x[0], n_rep)
    with pytest.raises(TypeError, match="n_rep must be an int, got float"):
        neuralops_gqa.repeat_kv(x, 1.0)  # type: ignore[arg-type]
    assert neuralops_gqa.repeat_kv(x, 1) is x


def test_repeat_kv_refuses_what_the_op_refuses_on_every_route() -> None:
    """n_rep == 1 and one KV head return views without calling the op; a tensor the op
    refuses (complex, sparse, quantized) is refused there too, with the op's message."""
    dense = _t(1, 1, 3, 4)
    refused = {
        "complex": (dense.to(torch.complex64), "must have a real dtype, got torch.complex64"),
        "sparse": (dense.to_sparse(), "must be a dense tensor, got layout torch.sparse_coo"),
        "quantized": (torch.quantize_per_tensor(dense, 0.1, 0, torch.qint8), "must be a dense tensor"),
    }
    for name, (x, message) in refused.items():
        for kv_heads, n_rep in ((1, 1), (1, 4), (2, 1), (2, 2)):
            one = x if kv_heads == 1 else torch.cat([x, x], dim=1)
            with pytest.raises(ValueError, match=f"repeat_kv: hidden_states {message}"):
                neuralops_gqa.repeat_kv(one, n_rep)
                pytest.fail(f"{name}, {kv_heads} KV heads, n_rep {n_rep}: no error")


@pytest.mark.skipif(
    not private_internals.ENABLED,
    reason=f"{private_internals.ENV}=0: the jagged tensor class is private, so the op's clear error is off "
    "(docs/usage/limitations.md)",
)
def test_jagged_nested_tensors_are_refused_clearly() -> None:
    njt = torch.nested.nested_tensor([torch.randn(2, 3, 4), torch.randn(2, 5, 4)], layout=torch.jagged)
    with pytest.raises(ValueError, match="gqa_expand: jagged nested tensors are not supported"):
        EXPAND(njt, njt, 2, 4)
    with pytest.raises(ValueError, match="gqa_reduce: jagged nested tensors are not supported"):
        REDUCE(njt, njt, 2, 2)


def test_vmap_errors_quote_the_samples_shapes() -> None:
    k = _t(7, 2, 3, 4)  # seven samples of a 3-D tensor: each sample is (2, 3, 4)
    with pytest.raises(ValueError, match=r"k must be 4-D \[B, H, N, D\], got shape \(2, 3, 4\)"):
        torch.vmap(lambda a: EXPAND(a, a, 2, 4))(k)
    g = _t(5, 1, 4, 3, 2)
    with pytest.raises(ValueError, match=r"grad_k.shape\[1\] \(4\) must equal num_heads \(8\)"):
        torch.vmap(lambda a: REDUCE(a, a, 2, 8))(g)


@pytest.mark.slow
def test_error_types_under_compile_and_export() -> None:
    """What docs/semantics.md promises: eager and torch.export raise our ValueError;
    torch.compile raises a RuntimeError subclass of dynamo's whose message holds ours."""
    k, bad = _t(2, 2, 3, 4), _t(2, 2, 4, 4)
    message = "k and v must agree in the sequence dim 2"

    class Expand(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return EXPAND(a, b, 2, 4)[0]  # type: ignore[no-any-return]

    with pytest.raises(ValueError, match=message):
        EXPAND(k, bad, 2, 4)
    with pytest.raises(ValueError, match=message):
        torch.export.export(Expand(), (k, bad))
    for fn in (lambda a, b: EXPAND(a, b, 2, 4), lambda a, b: neuralops_gqa.gqa_expand(a, b, 2, 2)):
        torch._dynamo.reset()
        with pytest.raises(RuntimeError, match=message) as info:
            torch.compile(fn, fullgraph=True, backend="aot_eager")(k, bad)
        assert isinstance(info.value, torch._dynamo.exc.TorchDynamoException)


@pytest.mark.slow
def test_wrapper_without_expansion_compiles_fullgraph() -> None:
    """n_rep == 1 returns the inputs, under torch.compile(fullgraph=True) too."""
    torch._dynamo.reset()
    k, v = _t(2, 3, 4, 5), _t(2, 3, 4, 6)
    out_k, out_v = torch.compile(lambda a, b: neuralops_gqa.gqa_expand(a, b, 3, 3), fullgraph=True)(k, v)
    assert torch.equal(out_k, k) and torch.equal(out_v, v)
    assert torch.equal(torch.compile(lambda a: neuralops_gqa.repeat_kv(a, 1), fullgraph=True)(k), k)


_SYMBOL = re.compile(r"\bs\d+\b")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fn", "args", "message"),
    [
        (lambda k, v: EXPAND(k, v, 4, 10), ((2, 4, 5, 4), (2, 4, 5, 3)), r"num_heads \(10\) must be a multiple of num_kv_heads \(4\)"),
        (lambda k, v: EXPAND(k, v, k.shape[1], 10), ((2, 4, 5, 4), (2, 4, 5, 3)), r"num_heads \(10\) must be a multiple of num_kv_heads \(4\)"),
        (lambda k, v: EXPAND(k, v, 2, 8), ((2, 4, 5, 4), (2, 4, 5, 3)), r"k.shape\[1\] \(4\) must equal num_kv_heads \(2\)"),
        (lambda k, v: EXPAND(k, v, 4, 8), ((2, 4, 5, 4), (2, 4, 6, 3)), r"got k \(2, 4, 5, 4\) and v \(2, 4, 6, 3\)"),
        (lambda k, v: REDUCE(k, v, 3, k.shape[1]), ((2, 8, 5, 4), (2, 8, 5, 3)), r"num_heads \(8\) must be a multiple of num_kv_heads \(3\)"),
        (lambda k, v: EXPAND(k, v[0], 4, 8), ((2, 4, 5, 4), (2, 4, 5, 3)), r"v must be 4-D \[B, H, N, D\], got shape \(4, 5, 3\)"),
    ],
    ids=["multiple", "multiple-symbolic-heads", "k-heads", "seq", "reduce-multiple", "v-3d"],
)  # fmt: skip
def test_dynamic_compile_messages_show_the_sizes(fn: Any, args: tuple, message: str) -> None:
    """Under torch.compile(dynamic=True) the sizes are symbols; the message shows the sizes the
    user passed, as in eager mode, never a symbol such as ``s37``."""
    torch._dynamo.reset()
    k, v = (torch.ones(shape) for shape in args)
    with pytest.raises((ValueError, RuntimeError), match=message) as info:
        torch.compile(fn, dynamic=True, backend="aot_eager")(k, v)
    ours = re.search(r"gqa_(expand|reduce): [^\n']*", str(info.value))
    assert ours is not None and not _SYMBOL.search(ours.group(0)), ours


@pytest.mark.slow
def test_exported_program_with_dynamic_head_counts() -> None:
    """An exported program with dynamic head counts: the op's checks become torch.export's
    guards on the program's inputs, which run before the op (docs/semantics.md). A count the
    divisibility guard refuses fails it with torch.export's AssertionError; zero KV heads make
    that guard itself divide by zero, before any check of ours can run (upstream: export
    evaluates its guards before its range checks, whatever Dim(min=...) says). Without the
    guards (``module(check_guards=False)``) the op's own check raises its ValueError."""

    class Expand(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return EXPAND(k, k, k.shape[1], q.shape[1])[0]  # type: ignore[no-any-return]

    q, k = _t(1, 8, 3, 4), _t(1, 2, 3, 4)
    dims = ({1: torch.export.Dim("hq", min=1)}, {1: torch.export.Dim("hk", min=1)})
    program = torch.export.export(Expand(), (q, k), dynamic_shapes=dims).module()
    assert program(q, _t(1, 4, 3, 4)).shape == (1, 8, 3, 4)
    with pytest.raises(AssertionError, match=r"Guard failed: q.size\(\)\[1\] % k.size\(\)\[1\] == 0"):
        program(q, _t(1, 3, 3, 4))
    with pytest.raises(ZeroDivisionError):
        program(q, _t(1, 0, 3, 4))
    # Without the guards, the op's own check answers.
    exported = torch.export.export(Expand(), (q, k), dynamic_shapes=dims)
    if "check_guards" not in inspect.signature(exported.module).parameters:
        pytest.skip(f"torch {torch.__version__}'s ExportedProgram.module has no check_guards")
    unchecked = exported.module(check_guards=False)
    with pytest.raises(
        ValueError, match=r"gqa_expand: num_heads \(8\) must be a multiple of num_kv_heads \(3\)"
    ):
        unchecked(q, _t(1, 3, 3, 4))
    with pytest.raises(ValueError, match="gqa_expand: num_kv_heads must be positive, got 0"):
        unchecked(q, _t(1, 0, 3, 4))


def test_repeat_kv_refuses_a_bad_backend_on_every_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """n_rep == 1 and one KV head return views without calling the op; a bad
    NEURALOPS_GQA_BACKEND still fails them, as every other call."""
    monkeypatch.setenv(BACKEND_ENV, "cuda-please")
    for x, n_rep in ((_t(1, 2, 3, 4), 1), (_t(1, 1, 3, 4), 4), (_t(1, 2, 3, 4), 2)):
        with pytest.raises(ValueError, match=f"{BACKEND_ENV} must be one of"):
            neuralops_gqa.repeat_kv(x, n_rep)


def _freed(*shape: int, requires_grad: bool = False) -> torch.Tensor:
    """A tensor whose storage was resized to 0 bytes after it was made (how FSDP frees a
    parameter's memory): its sizes stand, its data pointer is null."""
    x = torch.randn(*shape, device=DEVICE)
    x.untyped_storage().resize_(0)
    return x.requires_grad_(requires_grad)


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no-grad", "grad"])
def test_a_tensor_whose_memory_was_freed_is_refused(backend: str, requires_grad: bool) -> None:
    """Every route refuses a tensor with elements but no memory, naming it, before a kernel
    or ATen's copy reads address 0 (stock's copy crashes on one), also where a healthy
    tensor of the same layout ran first and its launch is cached."""
    # repeat_kv names its own argument where the private internals tell a freed tensor from
    # a functionalization wrapper (both have a null pointer); elsewhere the op's, k.
    one = "repeat_kv: hidden_states" if private_internals.ENABLED else "gqa_expand: k"
    calls: dict[str, tuple[Callable[[torch.Tensor, torch.Tensor], object], str, str]] = {
        "gqa_expand": (lambda k, v: neuralops_gqa.gqa_expand(k, v, 2, 4), "gqa_expand: k", "gqa_expand: v"),
        "torch.ops": (
            lambda k, v: torch.ops.neuralops.gqa_expand(k, v, 2, 4),
            "gqa_expand: k",
            "gqa_expand: v",
        ),
        "repeat_kv": (lambda k, v: (neuralops_gqa.repeat_kv(k, 2), neuralops_gqa.repeat_kv(v, 2)), one, one),
    }
    for route, (call, *names) in calls.items():
        for which, name in enumerate(names):
            healthy = [_t(2, 2, 3, 4, device=DEVICE).requires_grad_(requires_grad) for _ in range(2)]
            call(*healthy)
            args = [
                _freed(2, 2, 3, 4, requires_grad=requires_grad) if i == which else t
                for i, t in enumerate(healthy)
            ]
            with pytest.raises(RuntimeError, match=f"{name} has 48 elements but no memory"):
                call(*args)
                pytest.fail(f"{route}: no error")
    grads = [_t(2, 4, 3, 4, device=DEVICE) for _ in range(2)]
    torch.ops.neuralops.gqa_reduce(*grads, 2, 4)
    with pytest.raises(RuntimeError, match="gqa_reduce: grad_v has 96 elements but no memory"):
        torch.ops.neuralops.gqa_reduce(grads[0], _freed(2, 4, 3, 4), 2, 4)
    if requires_grad:  # a freed gradient handed to the backward
        k, v = (_t(2, 2, 3, 4, device=DEVICE).requires_grad_() for _ in range(2))
        with pytest.raises(RuntimeError, match="gqa_reduce: grad_k has 96 elements but no memory"):
            torch.autograd.grad(neuralops_gqa.gqa_expand(k, v, 2, 4), (k, v), (_freed(2, 4, 3, 4), grads[1]))
    _device_still_works()

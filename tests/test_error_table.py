"""Every cell of the two error tables of docs/semantics.md, on the route its column names.

Each row holds one or more bad calls. For every call and column the test runs the call that
way and checks the exception's type and message, and checks that the table's cell names that
type (or says ``—`` where the route can't receive the input): the page and the behaviour
can't drift apart. The first table is a call with bad arguments, eager, compiled and
exported; the second a program exported with good inputs and called with bad ones, through
``torch.export`` and in ONNX Runtime.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import DEVICE

from csrc_free_ops import private_internals

EXPAND = torch.ops.neuralops.gqa_expand
REDUCE = torch.ops.neuralops.gqa_reduce
PAGE = Path(__file__).parents[1] / "docs" / "semantics.md"


def _table(marker: str) -> dict[str, list[str]]:
    """``{first cell: the other cells}`` of the table after ``<!-- error table: marker -->``."""
    lines = PAGE.read_text().split(f"<!-- error table: {marker} -->\n", 1)[1].splitlines()
    rows = {}
    for line in lines[2:]:  # after the header and its rule
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        rows[cells[0]] = cells[1:]
    return rows


@dataclass
class Expect:
    """An exception of type ``kind`` whose message matches ``message``, a regex (None: the op's
    own message, the case's ``ours``)."""

    kind: type[BaseException]
    message: str | None = None


def _t(*shape: int, dtype: torch.dtype = torch.float32, device: str = DEVICE) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype, device=device)


def _jagged() -> torch.Tensor:
    parts = [torch.randn(2, 3, 16, device=DEVICE), torch.randn(2, 5, 16, device=DEVICE)]
    return torch.nested.nested_tensor(parts, layout=torch.jagged)


def _nested() -> torch.Tensor:
    return torch.nested.nested_tensor(
        [torch.randn(2, 3, 16, device=DEVICE), torch.randn(2, 5, 16, device=DEVICE)]
    )


def _quantized(*shape: int) -> torch.Tensor:
    return torch.quantize_per_tensor(torch.ones(shape), 0.1, 0, torch.qint8)


# ----------------------------------------------------------------------------------------
# A call with bad arguments: eager, torch.compile(fullgraph=True), torch.export.export.


@dataclass
class Call:
    """A bad call (``args()`` makes its arguments) and what each route raises."""

    name: str
    op: Any
    args: Callable[[], tuple[Any, ...]]
    ours: str  # a regex of the op's message
    eager: Expect
    compiled: Expect
    exported: Expect
    needs_private_internals: bool = False


# torch 2.11's export passes a jagged tensor on to the op; 2.13's fails on it first.
_JAGGED_EXPORT = (
    Expect(ValueError) if torch.__version__ < "2.13" else Expect(AttributeError, "has no attribute")
)
_VALUE = {"eager": Expect(ValueError), "compiled": Expect(torch._dynamo.exc.TorchRuntimeError), "exported": Expect(ValueError)}  # fmt: skip
_RUNTIME = {"eager": Expect(RuntimeError), "compiled": Expect(torch._dynamo.exc.TorchRuntimeError), "exported": Expect(RuntimeError)}  # fmt: skip
_UNSUPPORTED_FAKE = torch._subclasses.fake_tensor.UnsupportedFakeTensorException

CALLS: dict[str, list[Call]] = {
    "a head count: `num_heads` not a multiple of `num_kv_heads`, or not positive": [
        Call("not-multiple", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, 30), r"num_heads \(30\) must be a multiple of num_kv_heads \(4\)", **_VALUE),
        Call("zero-kv-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 0, 8), "num_kv_heads must be positive, got 0", **_VALUE),
        Call("negative-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, -8), "num_heads must be positive, got -8", **_VALUE),
        Call("reduce-not-multiple", REDUCE, lambda: (_t(1, 8, 2, 8), _t(1, 8, 2, 8), 3, 8), r"gqa_reduce: num_heads \(8\) must be a multiple of num_kv_heads \(3\)", **_VALUE),
    ],
    "`k.shape[1] != num_kv_heads` (`grad_k.shape[1] != num_heads`)": [
        Call("k-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 2, 8), r"k.shape\[1\] \(4\) must equal num_kv_heads \(2\)", **_VALUE),
        Call("grad-heads", REDUCE, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, 8), r"grad_k.shape\[1\] \(4\) must equal num_heads \(8\)", **_VALUE),
    ],
    "k and v disagree in batch, heads or sequence": [
        Call("batch", EXPAND, lambda: (_t(1, 4, 2, 8), _t(2, 4, 2, 8), 4, 8), "k and v must agree in the batch dim 0", **_VALUE),
        Call("v-heads", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 2, 2, 8), 4, 8), "k and v must agree in the head dim 1", **_VALUE),
        Call("seq", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 3, 8), 4, 8), r"k and v must agree in the sequence dim 2, got k \(1, 4, 2, 8\) and v \(1, 4, 3, 8\)", **_VALUE),
        Call("grad-seq", REDUCE, lambda: (_t(1, 8, 2, 8), _t(1, 8, 5, 8), 4, 8), "grad_k and grad_v must agree in the sequence dim 2", **_VALUE),
    ],
    "not 4-D": [
        Call("k-3d", EXPAND, lambda: (_t(4, 2, 8), _t(1, 4, 2, 8), 4, 8), r"k must be 4-D \[B, H, N, D\], got shape \(4, 2, 8\)", **_VALUE),
        Call("v-5d", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 1, 4, 2, 8), 4, 8), r"v must be 4-D", **_VALUE),
    ],
    "a complex k or v; a gradient not float16, bfloat16, float32 or float64": [
        Call("complex", EXPAND, lambda: (_t(1, 4, 2, 8, dtype=torch.complex64), _t(1, 4, 2, 8), 4, 8), "k must have a real dtype, got torch.complex64", **_VALUE),
        Call("grad-int", REDUCE, lambda: (_t(1, 8, 2, 8, dtype=torch.int32), _t(1, 8, 2, 8), 4, 8), "grad_k must be float16, bfloat16, float32 or float64, got torch.int32", **_VALUE),
    ],
    "sparse": [
        Call("sparse", EXPAND, lambda: (_t(1, 4, 2, 8).to_sparse(), _t(1, 4, 2, 8), 4, 8), "k must be a dense tensor, got layout torch.sparse_coo",
             eager=Expect(ValueError), compiled=Expect(torch._dynamo.exc.Unsupported, "sparse Tensor"), exported=Expect(ValueError)),
    ],
    "quantized": [
        Call("quantized", EXPAND, lambda: (_t(1, 4, 2, 8, device="cpu"), _quantized(1, 4, 2, 8), 4, 8), "v must be a dense tensor, got layout torch.strided and dtype torch.qint8",
             eager=Expect(ValueError), compiled=Expect(torch._dynamo.exc.Unsupported, "quantized nyi in meta tensors"), exported=Expect(_UNSUPPORTED_FAKE, "quantized nyi in meta tensors")),
    ],
    "jagged nested": [
        Call("jagged", EXPAND, lambda: (_jagged(), _jagged(), 2, 4), "gqa_expand: jagged nested tensors are not supported",
             eager=Expect(ValueError), compiled=Expect(torch._dynamo.exc.TorchRuntimeError),
             exported=_JAGGED_EXPORT, needs_private_internals=True),
    ],
    "nested, strided layout (`torch.nested`'s default)": [
        Call("nested", EXPAND, lambda: (_nested(), _nested(), 2, 4), "gqa_expand: k must be a dense tensor, got a nested tensor",
             eager=Expect(ValueError), compiled=Expect(torch._dynamo.exc.Unsupported, "strided NestedTensor"),
             exported=Expect(RuntimeError, "NestedTensorImpl doesn't support sizes")),
    ],
    "k and v on different devices": [
        Call("devices", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8, device="meta"), 4, 8), "k and v must be on one device", **_RUNTIME),
    ],
    "not a tensor": [
        Call("none", EXPAND, lambda: (_t(1, 4, 2, 8), None, 4, 8), "gqa_expand: v must be a Tensor, got NoneType",
             eager=Expect(TypeError), compiled=Expect(torch._dynamo.exc.TorchRuntimeError), exported=Expect(TypeError)),
    ],
    "a head count not an int": [
        Call("float-count", EXPAND, lambda: (_t(1, 4, 2, 8), _t(1, 4, 2, 8), 4, 8.5), "Expected a value of type 'int' for argument 'num_heads'", **_RUNTIME),
    ],
}  # fmt: skip
CALL_ROUTES = ("eager", "compiled", "exported")


def _raises(expect: Expect, ours: str, run: Callable[[], object]) -> BaseException:
    pattern = ours if expect.message is None else expect.message
    with pytest.raises(BaseException) as info:
        run()
    assert type(info.value) is expect.kind or isinstance(info.value, expect.kind), (
        f"{type(info.value).__name__}, not {expect.kind.__name__}: {info.value}"
    )
    assert re.search(pattern, str(info.value)), f"{pattern!r} not in {str(info.value)[:2000]!r}"
    return info.value


class _Module(torch.nn.Module):
    """A call of ``op`` on its tensor arguments, the rest constants of the program."""

    def __init__(self, op: Any, constants: tuple[Any, ...]) -> None:
        super().__init__()
        self.op, self.constants = op, constants

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        return self.op(a, b, *self.constants)


def _run_call(call: Call, route: str, args: tuple[Any, ...]) -> None:
    if route == "eager":
        call.op(*args)
    elif route == "compiled":
        torch._dynamo.reset()  # each call traces afresh, never falling back to eager
        torch.compile(lambda *a: call.op(*a), fullgraph=True, backend="eager")(*args)
    else:
        torch.export.export(_Module(call.op, args[2:]), args[:2])


_CALL_CASES = [
    pytest.param(
        row, call, route, id=f"{call.name}-{route}", marks=[pytest.mark.slow] if route != "eager" else []
    )
    for row, calls in CALLS.items()
    for call in calls
    for route in CALL_ROUTES
]


def test_the_calls_table_has_these_rows() -> None:
    assert list(_table("calls")) == list(CALLS)


@pytest.mark.parametrize(("row", "call", "route"), _CALL_CASES)
def test_a_call_with_bad_arguments(row: str, call: Call, route: str) -> None:
    expect: Expect = getattr(call, route)
    cell = _table("calls")[row][CALL_ROUTES.index(route)]
    assert f"`{expect.kind.__name__}`" in cell, (
        f"the table says {cell!r} where {expect.kind.__name__} is raised"
    )
    if call.needs_private_internals and route != "exported" and not private_internals.ENABLED:
        pytest.skip(
            f"{private_internals.ENV}=0: the op's clear error for this layout is off (docs/usage/limitations.md)"
        )
    args = call.args()  # built outside the expected error: a failure to build them is no pass
    _raises(expect, call.ours, lambda: _run_call(call, route, args))


@pytest.mark.slow
@pytest.mark.parametrize("row", [row for row, calls in CALLS.items() if calls[0].exported.message is None])
def test_onnx_export_reports_the_export_error(row: str) -> None:
    """torch.onnx.export runs torch.export first and reports its error, message and all."""
    pytest.importorskip("onnxscript", reason="onnx export needs the onnx extra (pip install '.[onnx]')")
    import neuralops_gqa.onnx

    call = CALLS[row][0]
    args = call.args()
    from torch.onnx._internal.exporter._errors import TorchExportError

    def export() -> None:
        torch.onnx.export(
            _Module(call.op, args[2:]).eval(),
            args[:2],
            dynamo=True,
            custom_translation_table=neuralops_gqa.onnx.translation_table(),
            verbose=False,
        )

    error = _raises(Expect(TorchExportError), call.ours, export)
    assert isinstance(error, RuntimeError) and isinstance(error.__cause__, call.exported.kind)


# ----------------------------------------------------------------------------------------
# A program exported with good inputs (constant head counts, dynamic batch and sequence),
# called with bad ones: ep.module(), ep.module(check_guards=False), and ONNX Runtime.

_K, _V = (3, 2, 20, 16), (3, 2, 20, 8)  # the expansion's example inputs
_GK, _GV = (3, 8, 20, 16), (3, 8, 20, 8)  # the reduction's


@dataclass
class Feed:
    """Bad inputs for the program of ``op`` (``"expand"`` or ``"reduce"``) and what each route
    raises (None: the route can't receive them)."""

    name: str
    op: str
    inputs: Callable[[], tuple[Any, Any]]
    program: Expect | None
    unchecked: Expect | None
    onnx: Expect | None
    ours: str = ""


def _ort(name: str) -> type[BaseException]:
    """ONNX Runtime's exception class ``name`` (imported when a test needs it)."""
    ort = pytest.importorskip(
        "onnxruntime", reason="onnx export needs the onnx extra (pip install '.[onnx]')"
    )
    return getattr(ort.capi.onnxruntime_pybind11_state, name)  # type: ignore[no-any-return]


class OrtError(Expect):
    """ONNX Runtime's ``InvalidArgument`` (or ``name``), looked up when the test runs."""

    def __init__(self, message: str, name: str = "InvalidArgument") -> None:
        super().__init__(BaseException, message)
        self.name = name


_GUARD = AssertionError
PROGRAMS: dict[str, list[Feed]] = {
    "a head count": [],
    "a size the export fixed: `k.shape[1]`, v's heads, a head dim": [
        Feed("k-heads", "expand", lambda: (_t(3, 4, 20, 16, device="cpu"), _t(*_V, device="cpu")),
             Expect(_GUARD, r"Guard failed: k\.size\(\)\[1\] == 2"), Expect(RuntimeError, r"Expected input at \*args\[0\]\.shape\[1\] to be equal to 2, but got 4"),
             OrtError("Got invalid dimensions for input: k")),
        Feed("v-head-dim", "expand", lambda: (_t(*_K, device="cpu"), _t(3, 2, 20, 4, device="cpu")),
             Expect(_GUARD, r"Guard failed: v\.size\(\)\[3\] == 8"), Expect(RuntimeError, r"Expected input at \*args\[1\]\.shape\[3\] to be equal to 8, but got 4"),
             OrtError("Got invalid dimensions for input: v")),
        Feed("grad-heads", "reduce", lambda: (_t(3, 4, 20, 16, device="cpu"), _t(*_GV, device="cpu")),
             Expect(_GUARD, r"Guard failed: grad_k\.size\(\)\[1\] == 8"), Expect(RuntimeError, r"Expected input at \*args\[0\]\.shape\[1\] to be equal to 8, but got 4"),
             OrtError("Got invalid dimensions for input: grad_k")),
    ],
    "k and v disagree in batch or sequence": [
        Feed("seq", "expand", lambda: (_t(*_K, device="cpu"), _t(3, 2, 21, 8, device="cpu")),
             Expect(_GUARD, r"Guard failed: v\.size\(\)\[2\] == k\.size\(\)\[2\]"), Expect(RuntimeError, r"Expected input at \*args\[1\]\.shape\[2\] to be equal to 20, but got 21"),
             OrtError("indices element out of data bounds")),
        Feed("batch", "expand", lambda: (_t(*_K, device="cpu"), _t(1, 2, 20, 8, device="cpu")),
             Expect(_GUARD, r"Guard failed: v\.size\(\)\[0\] == k\.size\(\)\[0\]"), Expect(RuntimeError, r"Expected input at \*args\[1\]\.shape\[0\] to be equal to 3, but got 1"),
             OrtError("indices element out of data bounds")),
        Feed("grad-seq", "reduce", lambda: (_t(*_GK, device="cpu"), _t(3, 8, 7, 8, device="cpu")),
             Expect(_GUARD, r"Guard failed: grad_v\.size\(\)\[2\] == grad_k\.size\(\)\[2\]"), Expect(RuntimeError, r"Expected input at \*args\[1\]\.shape\[2\] to be equal to 20, but got 7"),
             OrtError("indices element out of data bounds")),
    ],
    "fewer dims than 4": [
        Feed("k-3d", "expand", lambda: (_t(3, 2, 20, device="cpu"), _t(*_V, device="cpu")),
             Expect(IndexError, "tuple index out of range"), Expect(RuntimeError, "Unexpected number of dimensions"),
             OrtError("Invalid rank for input: k")),
    ],
    "more dims than 4": [
        Feed("k-5d", "expand", lambda: (_t(*_K, 1, device="cpu"), _t(*_V, device="cpu")),
             Expect(ValueError), Expect(RuntimeError, "Unexpected number of dimensions"),
             OrtError("Invalid rank for input: k"), r"k must be 4-D \[B, H, N, D\], got shape \(3, 2, 20, 16, 1\)"),
    ],
    "a complex k or v; a gradient not float16, bfloat16, float32 or float64": [
        Feed("complex", "expand", lambda: (_t(*_K, dtype=torch.complex64, device="cpu"), _t(*_V, device="cpu")),
             Expect(ValueError), Expect(ValueError), Expect(RuntimeError, "can't be converted to MLDataType"),
             "k must have a real dtype, got torch.complex64"),
        Feed("grad-int", "reduce", lambda: (_t(*_GK, dtype=torch.int32, device="cpu"), _t(*_GV, device="cpu")),
             Expect(ValueError), Expect(ValueError), OrtError("Unexpected input data type"),
             "grad_k must be float16, bfloat16, float32 or float64, got torch.int32"),
    ],
    "sparse, quantized": [
        Feed("sparse", "expand", lambda: (_t(*_K, device="cpu").to_sparse(), _t(*_V, device="cpu")),
             Expect(ValueError), Expect(ValueError), None, "k must be a dense tensor, got layout torch.sparse_coo"),
        Feed("quantized", "expand", lambda: (_t(*_K, device="cpu"), _quantized(*_V)),
             Expect(ValueError), Expect(ValueError), None, "v must be a dense tensor, got layout torch.strided and dtype torch.qint8"),
    ],
    "jagged nested": [
        Feed("jagged", "expand", lambda: (_jagged().cpu(), _jagged().cpu()),
             Expect(_GUARD, "Guard failed"), Expect(AttributeError, "has no attribute"), None),
    ],
    "nested, strided layout": [
        Feed("nested", "expand", lambda: (_nested().cpu(), _nested().cpu()),
             Expect(RuntimeError, "NestedTensorImpl doesn't support sizes"), Expect(RuntimeError, "NestedTensorImpl doesn't support sizes"), None),
    ],
    "k and v on different devices": [
        Feed("devices", "expand", lambda: (_t(*_K, device="cpu"), _t(*_V, device="meta")),
             Expect(RuntimeError), Expect(RuntimeError), None, "k and v must be on one device, got cpu and meta"),
    ],
    "not a tensor": [
        Feed("none", "expand", lambda: (_t(*_K, device="cpu"), None),
             Expect(AttributeError, "'NoneType' object has no attribute 'size'"), Expect(RuntimeError, r"Expected input at \*args\[1\] to be a tensor"), None),
    ],
}  # fmt: skip
PROGRAM_ROUTES = ("program", "unchecked", "onnx")


class _KV(torch.nn.Module):
    """The op on two named inputs: the names the guards and ONNX Runtime quote."""

    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, k: torch.Tensor, v: torch.Tensor) -> Any:
        return self.op(k, v, 2, 8)


class _Grads(_KV):
    def forward(self, grad_k: torch.Tensor, grad_v: torch.Tensor) -> Any:  # type: ignore[override]
        return self.op(grad_k, grad_v, 2, 8)


Programs = dict[tuple[str, str], Any]


@pytest.fixture(scope="module")
def programs() -> Programs:
    """Each op's program per route, exported with good inputs on first use."""
    return {}


def _program(programs: Programs, op: str, route: str) -> Any:
    if (op, route) not in programs:
        module = _KV(EXPAND) if op == "expand" else _Grads(REDUCE)
        examples = tuple(torch.randn(shape) for shape in ((_K, _V) if op == "expand" else (_GK, _GV)))
        dims = tuple({0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO} for _ in examples)
        if route == "onnx":
            pytest.importorskip(
                "onnxscript", reason="onnx export needs the onnx extra (pip install '.[onnx]')"
            )
            ort = pytest.importorskip(
                "onnxruntime", reason="onnx export needs the onnx extra (pip install '.[onnx]')"
            )
            import neuralops_gqa.onnx

            onnx_program = torch.onnx.export(
                module.eval(),
                examples,
                dynamo=True,
                dynamic_shapes=dims,
                custom_translation_table=neuralops_gqa.onnx.translation_table(),
                verbose=False,
            )
            assert onnx_program is not None
            programs[op, route] = ort.InferenceSession(onnx_program.model_proto.SerializeToString())
        else:
            ep = torch.export.export(module, examples, dynamic_shapes=dims)
            programs[op, route] = ep.module() if route == "program" else ep.module(check_guards=False)
    return programs[op, route]


def _call_program(program: Any, route: str, inputs: tuple[Any, Any]) -> None:
    if route != "onnx":
        program(*inputs)
        return
    names = [i.name for i in program.get_inputs()]
    program.run(None, {name: x.numpy() for name, x in zip(names, inputs)})


_PROGRAM_CASES = [
    pytest.param(row, feed, route, id=f"{feed.name}-{route}")
    for row, feeds in PROGRAMS.items()
    for feed in feeds
    for route in PROGRAM_ROUTES
]


def test_the_programs_table_has_these_rows() -> None:
    assert list(_table("exported programs")) == list(PROGRAMS)


def test_a_head_count_is_a_constant_of_every_program() -> None:
    assert all(cell.startswith("—") for cell in _table("exported programs")["a head count"])


@pytest.mark.slow
@pytest.mark.parametrize(("row", "feed", "route"), _PROGRAM_CASES)
def test_an_exported_program_called_with_bad_inputs(
    programs: Programs, row: str, feed: Feed, route: str
) -> None:
    expect: Expect | None = getattr(feed, route)
    cell = _table("exported programs")[row][PROGRAM_ROUTES.index(route)]
    if expect is None:
        assert cell.startswith("—"), f"the table says {cell!r} where the route takes no such input"
        return
    if isinstance(expect, OrtError):
        expect = Expect(_ort(expect.name), expect.message)
    assert f"`{expect.kind.__name__}`" in cell, (
        f"the table says {cell!r} where {expect.kind.__name__} is raised"
    )
    if (
        route == "unchecked"
        and "check_guards" not in inspect.signature(torch.export.ExportedProgram.module).parameters
    ):
        pytest.skip(f"torch {torch.__version__}'s ExportedProgram.module has no check_guards")
    program = _program(programs, feed.op, route)
    inputs = feed.inputs()  # built outside the expected error
    _raises(expect, feed.ours, lambda: _call_program(program, route, inputs))

"""ONNX export with ``neuralops_gqa.onnx.translation_table()``, run in ONNX Runtime at every size,
empty ones included, and k and v that disagree refused as the op refuses them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import neuralops_gqa

ort = pytest.importorskip("onnxruntime", reason="onnx export needs the onnx extra (pip install '.[onnx]')")
pytest.importorskip("onnxscript", reason="onnx export needs the onnx extra (pip install '.[onnx]')")
import neuralops_gqa.onnx  # noqa: E402  (needs onnxscript)

pytestmark = pytest.mark.slow  # every test exports

EXPAND = torch.ops.neuralops.gqa_expand
REDUCE = torch.ops.neuralops.gqa_reduce


class _One(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, a: torch.Tensor) -> Any:
        return self.fn(a)


class _Two(_One):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:  # type: ignore[override]
        return self.fn(a, b)


def _session(fn: Callable[..., Any], examples: tuple[torch.Tensor, ...], dynamic: tuple[int, ...]) -> Any:
    """An ONNX Runtime session of ``fn`` exported with ``dynamic`` dims of every input."""
    dims = tuple({dim: torch.export.Dim.AUTO for dim in dynamic} for _ in examples)
    program = torch.onnx.export(
        (_One if len(examples) == 1 else _Two)(fn).eval(),
        examples,
        dynamo=True,
        dynamic_shapes=dims,
        custom_translation_table=neuralops_gqa.onnx.translation_table(),
        verbose=False,
    )
    assert program is not None
    assert {node.domain for node in program.model_proto.graph.node} <= {"", "ai.onnx"}
    return ort.InferenceSession(program.model_proto.SerializeToString())


def _run(session: Any, *tensors: torch.Tensor) -> list[torch.Tensor]:
    names = [i.name for i in session.get_inputs()]
    return [
        torch.from_numpy(out) for out in session.run(None, dict(zip(names, (t.numpy() for t in tensors))))
    ]


# (batch, sequence) fed to programs exported at (3, 20): empty batches and sequences included.
SIZES = [(2, 7), (0, 7), (2, 0), (0, 0), (1, 1)]
_SIZE_IDS = [f"B{b}-N{n}" for b, n in SIZES]


@pytest.fixture(scope="module")
def sessions() -> dict[str, Any]:
    k, v = torch.randn(3, 2, 20, 16), torch.randn(3, 2, 20, 8)
    g = torch.randn(3, 8, 20, 16)
    return {
        # k and v of different head dims; both head dims dynamic too, so a zero width can be fed.
        "expand": _session(lambda a, b: EXPAND(a, b, 2, 8), (k, v), (0, 2, 3)),
        # One tensor expanded beside a zero-width v (docs/usage/eager.md), exported that way.
        "zero-width-v": _session(lambda a, b: EXPAND(a, b, 2, 8), (k, k.new_empty(3, 2, 20, 0)), (0, 2)),
        "repeat_kv": _session(lambda a: neuralops_gqa.repeat_kv(a, 4), (k,), (0, 2)),
        "reduce": _session(lambda a, b: REDUCE(a, b, 2, 8), (g, g[..., :8].clone()), (0, 2, 3)),
    }


@pytest.mark.parametrize(("batch", "seq"), SIZES, ids=_SIZE_IDS)
@pytest.mark.parametrize(("dim_k", "dim_v"), [(16, 8), (0, 8), (16, 0)], ids=["Dk16-Dv8", "Dk0", "Dv0"])
def test_expand_at_every_size(sessions: dict[str, Any], batch: int, seq: int, dim_k: int, dim_v: int) -> None:
    k, v = torch.randn(batch, 2, seq, dim_k), torch.randn(batch, 2, seq, dim_v)
    k8, v8 = _run(sessions["expand"], k, v)
    assert torch.equal(k8, k.repeat_interleave(4, 1)) and torch.equal(v8, v.repeat_interleave(4, 1))


@pytest.mark.parametrize(("batch", "seq"), SIZES, ids=_SIZE_IDS)
def test_one_tensor_beside_a_zero_width_v(sessions: dict[str, Any], batch: int, seq: int) -> None:
    k = torch.randn(batch, 2, seq, 16)
    k8, v8 = _run(sessions["zero-width-v"], k, k[..., :0])
    assert torch.equal(k8, k.repeat_interleave(4, 1)) and v8.shape == (batch, 8, seq, 0)
    (x4,) = _run(sessions["repeat_kv"], k)
    assert torch.equal(x4, k.repeat_interleave(4, 1))


@pytest.mark.parametrize(("batch", "seq"), SIZES, ids=_SIZE_IDS)
@pytest.mark.parametrize("dim_v", [8, 0], ids=["Dv8", "Dv0"])
def test_reduce_at_every_size(sessions: dict[str, Any], batch: int, seq: int, dim_v: int) -> None:
    g_k, g_v = torch.randn(batch, 8, seq, 16), torch.randn(batch, 8, seq, dim_v)
    r_k, r_v = _run(sessions["reduce"], g_k, g_v)
    # ONNX sums in float64 and rounds once, like the op, but in its own order: float32's
    # rounding of two float64 sums of four terms can differ in the last bit.
    torch.testing.assert_close(r_k, g_k.double().unflatten(1, (2, 4)).sum(2).float(), rtol=1.2e-7, atol=0)
    torch.testing.assert_close(r_v, g_v.double().unflatten(1, (2, 4)).sum(2).float(), rtol=1.2e-7, atol=0)


# k and v (or the two gradients) that disagree in batch or sequence, where ONNX Runtime holds
# neither input to the symbolic size the exported graph gives both; one of them 1 or 0, where
# a broadcast or an empty tensor could have hidden the difference.
DISAGREEING = [((3, 5), (1, 5)), ((1, 5), (3, 5)), ((3, 5), (3, 1)), ((3, 0), (3, 5)), ((0, 5), (2, 5))]


@pytest.mark.parametrize(("sizes_k", "sizes_v"), DISAGREEING, ids=lambda s: f"B{s[0]}-N{s[1]}")
@pytest.mark.parametrize("op", ["expand", "reduce"])
def test_disagreeing_sizes_are_refused(
    sessions: dict[str, Any], op: str, sizes_k: tuple[int, int], sizes_v: tuple[int, int]
) -> None:
    heads = 2 if op == "expand" else 8
    a = torch.randn(sizes_k[0], heads, sizes_k[1], 16)
    b = torch.randn(sizes_v[0], heads, sizes_v[1], 8)
    with pytest.raises(Exception, match="indices element out of data bounds"):
        _run(sessions[op], a, b)

"""ONNX export of models that call the ops: translations into standard ONNX operators.

``torch.onnx.export(..., dynamo=True)`` keeps ``neuralops::gqa_expand`` as one node (like
``torch.export``) and needs to be told what it is in ONNX; pass the table below:

    onnx_program = torch.onnx.export(
        model, args, dynamo=True, custom_translation_table=neuralops_gqa.onnx.translation_table()
    )

``gqa_expand`` becomes ``Unsqueeze -> Expand -> Reshape`` per tensor and ``gqa_reduce``
``Reshape -> ReduceSum`` (summed in float64, then cast back to the gradient's type), all in
the default ONNX domain (opset 18), with batch and sequence sizes read from the input's
``Shape``, so dynamic batch and sequence dims stay dynamic. Head counts must be constants
of the exported graph (they are model constants). Needs ``onnxscript`` (the ``onnx`` extra:
``pip install ".[onnx]"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def translation_table() -> dict[Any, Callable[..., Any]]:
    """``{op overload: ONNX translation}`` for ``torch.onnx.export(custom_translation_table=...)``.

    Example:
        >>> import neuralops_gqa.onnx
        >>> sorted(str(op) for op in neuralops_gqa.onnx.translation_table())
        ['neuralops.gqa_expand.default', 'neuralops.gqa_reduce.default']
    """
    import onnx
    from onnxscript import opset18 as op

    def ints(*values: int) -> Any:
        return op.Constant(value_ints=list(values))

    def heads_reshaped(x: Any, heads: tuple[int, ...]) -> Any:
        """``x``'s shape with dim 1 replaced by ``heads`` (one or two dims)."""
        shape = op.Shape(x)
        return op.Concat(
            op.Slice(shape, ints(0), ints(1)), ints(*heads), op.Slice(shape, ints(2), ints(4)), axis=0
        )

    def expand_one(x: Any, kv_heads: int, n_rep: int) -> Any:
        grouped = op.Expand(op.Unsqueeze(x, ints(2)), heads_reshaped(x, (kv_heads, n_rep)))
        return op.Reshape(grouped, heads_reshaped(x, (kv_heads * n_rep,)))

    def reduce_one(g: Any, kv_heads: int, n_rep: int) -> Any:
        grouped: Any = op.Cast(
            op.Reshape(g, heads_reshaped(g, (kv_heads, n_rep))), to=onnx.TensorProto.DOUBLE
        )
        return op.CastLike(op.ReduceSum(grouped, ints(2), keepdims=0), g)

    def gqa_expand(k: Any, v: Any, num_kv_heads: int, num_heads: int) -> tuple[Any, Any]:
        n_rep = num_heads // num_kv_heads
        return expand_one(k, num_kv_heads, n_rep), expand_one(v, num_kv_heads, n_rep)

    def gqa_reduce(grad_k: Any, grad_v: Any, num_kv_heads: int, num_heads: int) -> tuple[Any, Any]:
        n_rep = num_heads // num_kv_heads
        return reduce_one(grad_k, num_kv_heads, n_rep), reduce_one(grad_v, num_kv_heads, n_rep)

    return {
        torch.ops.neuralops.gqa_expand.default: gqa_expand,
        torch.ops.neuralops.gqa_reduce.default: gqa_reduce,
    }

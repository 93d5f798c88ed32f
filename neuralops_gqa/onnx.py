"""ONNX export of models that call the ops: translations into standard ONNX operators.

``torch.onnx.export(..., dynamo=True)`` keeps ``neuralops::gqa_expand`` as one node (like
``torch.export``) and needs to be told what it is in ONNX; pass the table below:

    onnx_program = torch.onnx.export(
        model, args, dynamo=True, custom_translation_table=neuralops_gqa.onnx.translation_table()
    )

``gqa_expand`` becomes ``Unsqueeze -> Expand -> Reshape`` per tensor and ``gqa_reduce``
``Reshape -> ReduceSum`` (summed in float64, then cast back to the gradient's type), all in
the default ONNX domain (opset 18), with batch and sequence sizes read from the inputs'
``Shape``, so dynamic batch and sequence dims stay dynamic, every size 0 included. The two
tensors' sizes are checked to agree, as the op checks them. Head counts must be constants
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

    def agreed_sizes(a: Any, b: Any) -> Any:
        """``a``'s batch, heads and sequence, once checked against ``b``'s: the op's check.

        ONNX has no assert and ONNX Runtime does not hold inputs to the symbolic sizes they
        share, so the check is a ``Gather`` from a one-element tensor at the squared
        differences, an index out of range (a runtime error) unless every one is 0; the
        zeros it gathers are added to the sizes, so no optimizer drops it. (A ``Concat`` of
        zero-width slices would cost less but checks nothing: ONNX Runtime skips empty
        inputs, and onnxscript's optimizer removes them.)
        """
        sizes = op.Slice(op.Shape(a), ints(0), ints(3))
        difference = op.Sub(sizes, op.Slice(op.Shape(b), ints(0), ints(3)))
        return op.Add(sizes, op.Gather(ints(0), op.Mul(difference, difference)))

    def sizes_with_heads(sizes: Any, x: Any, heads: tuple[int, ...]) -> Any:
        """``[B, *heads, N, D]``: batch and sequence from ``sizes``, the head dim from ``x``."""
        return op.Concat(
            op.Slice(sizes, ints(0), ints(1)),
            ints(*heads),
            op.Slice(sizes, ints(2), ints(3)),
            op.Slice(op.Shape(x), ints(3), ints(4)),
            axis=0,
        )

    # Every Reshape takes allowzero=1: its target holds real sizes, where a 0 is an empty
    # batch or sequence or a zero-width tensor (repeat_kv's stand-in v), not Reshape's
    # default "copy this dim from the input", which fails on the new rank.
    def expand_one(x: Any, sizes: Any, kv_heads: int, n_rep: int) -> Any:
        grouped = op.Expand(op.Unsqueeze(x, ints(2)), sizes_with_heads(sizes, x, (kv_heads, n_rep)))
        return op.Reshape(grouped, sizes_with_heads(sizes, x, (kv_heads * n_rep,)), allowzero=1)

    def reduce_one(g: Any, sizes: Any, kv_heads: int, n_rep: int) -> Any:
        grouped = op.Reshape(g, sizes_with_heads(sizes, g, (kv_heads, n_rep)), allowzero=1)
        # Any: onnxscript's types of Cast's result are wider than ReduceSum's of its input.
        in_double: Any = op.Cast(grouped, to=onnx.TensorProto.DOUBLE)
        summed: Any = op.ReduceSum(in_double, ints(2), keepdims=0)
        return op.CastLike(summed, g)

    def gqa_expand(k: Any, v: Any, num_kv_heads: int, num_heads: int) -> tuple[Any, Any]:
        n_rep, sizes = num_heads // num_kv_heads, agreed_sizes(k, v)
        return expand_one(k, sizes, num_kv_heads, n_rep), expand_one(v, sizes, num_kv_heads, n_rep)

    def gqa_reduce(grad_k: Any, grad_v: Any, num_kv_heads: int, num_heads: int) -> tuple[Any, Any]:
        n_rep, sizes = num_heads // num_kv_heads, agreed_sizes(grad_k, grad_v)
        return reduce_one(grad_k, sizes, num_kv_heads, n_rep), reduce_one(grad_v, sizes, num_kv_heads, n_rep)

    return {
        torch.ops.neuralops.gqa_expand.default: gqa_expand,
        torch.ops.neuralops.gqa_reduce.default: gqa_reduce,
    }

"""The one validation of both ops' arguments, shared by every implementation and the fakes.

Eager calls, traces under ``torch.compile``/``torch.export`` (the fake implementations),
the traced bodies and the DTensor and vmap rules all call ``check_inputs``, so a bad
argument fails with the same message wherever it is caught, e.g.
``gqa_expand: num_heads (30) must be a multiple of num_kv_heads (4)``.

Each rule is written once. What a tensor is (rank, layout, dtype, device) is a plain test;
a rule on sizes or head counts, which may be symbols of a dynamic-shape trace, is
``_require(condition, message template, values...)``. With plain values (an eager call, a
hot path) a rule costs its comparison: the message is formatted only when it fails. An
undecided symbolic condition goes through ``torch._check_with``, so it becomes a guard or a
runtime assert rather than a specialisation, and messages show the sizes of the example the
trace was started with, not symbols.
"""

from __future__ import annotations

import operator

import torch
from torch import SymBool, SymInt, Tensor, strided

from neuralops_gqa import private_internals

REDUCE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The gradients' dtypes: ``gqa_reduce`` sums in float32 (float64 for float64)."""

_DIMS = ((0, "batch"), (1, "head"), (2, "sequence"))


def _shown(value: object) -> object:
    """A size as the user gave it: a symbolic size's example value, a shape's sizes as ints."""
    if isinstance(value, SymInt):
        example = private_internals.symbolic_example_value(value)
        return value if example is None else example
    if isinstance(value, tuple):  # torch.Size too
        return tuple(_shown(v) for v in value)
    return value


def _require(cond: object, template: str, *values: object, error: type[Exception] = ValueError) -> None:
    """Raise ``error(template.format(*values))`` unless ``cond`` holds.

    A settled condition (a bool, a numpy bool) raises plainly; a symbolic one goes through
    ``torch._check_with`` (a ``ValueError`` or ``RuntimeError`` under ``torch.export``; dynamo
    wraps it in a ``RuntimeError`` subclass that carries the message).
    """
    if not isinstance(cond, SymBool):
        if cond:
            return
        raise error(template.format(*(_shown(v) for v in values)))
    message = template.format(*(_shown(v) for v in values))
    torch._check_with(error, cond, lambda: message)


def check_tensor(op: str, name: str, x: object, gradient: bool = False) -> None:
    """Raise a ``TypeError``/``ValueError`` naming ``name`` unless ``x`` is a 4-D dense tensor
    of a dtype the op takes (a real dtype; for a ``gradient``, a floating one it sums).

    What a tensor is (its rank, layout, dtype) is never symbolic: plain tests.
    """
    if not isinstance(x, Tensor):  # the schema lets None through as an undefined tensor
        raise TypeError(f"{op}: {name} must be a Tensor, got {type(x).__name__}")
    if x.is_nested:  # strided or jagged: neither has the sizes of one [B, H, N, D] tensor
        raise ValueError(
            f"{op}: {name} must be a dense tensor, got a nested tensor (pad it, e.g. with "
            "to_padded_tensor(0), or call the op on each sequence)"
        )
    if x.dim() != 4:
        raise ValueError(f"{op}: {name} must be 4-D [B, H, N, D], got shape {_shown(x.shape)}")
    if x.layout != strided or x.is_quantized:
        raise ValueError(f"{op}: {name} must be a dense tensor, got layout {x.layout} and dtype {x.dtype}")
    if gradient and x.dtype not in REDUCE_DTYPES:
        raise ValueError(f"{op}: {name} must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if not gradient and x.dtype.is_complex:
        raise ValueError(f"{op}: {name} must have a real dtype, got {x.dtype}")


def check_memory(op: str, name: str, x: Tensor) -> None:
    """Raise a ``RuntimeError`` naming ``x`` if it has elements but no memory: its storage
    was resized to 0 bytes after it was made (how FSDP frees a parameter's), so its data
    pointer is null and a kernel would read address 0. For the CPU and CUDA tensors the
    device kernels get (a wrapper's null pointer means something else)."""
    if not x.data_ptr() and x.numel():
        raise RuntimeError(
            f"{op}: {name} has {x.numel()} elements but no memory: its storage was resized to 0 bytes"
        )


def integer(op: str, name: str, value: object) -> int:
    """``value`` as an ``int`` (a symbolic size stays one), or a ``TypeError`` naming it: an
    integer is whatever ``operator.index`` takes (a numpy integer, a one-element integer
    tensor), as for PyTorch's own int arguments; never a ``bool`` (nor a bool tensor), a float
    or a float tensor."""
    if isinstance(value, (int, SymInt)) and not isinstance(value, bool):
        return value  # type: ignore[return-value]
    if not isinstance(value, bool) and not (isinstance(value, Tensor) and value.dtype == torch.bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__} {value!r}")


def check_head_counts(op: str, num_kv_heads: object, num_heads: object) -> tuple[int, int]:
    """Both head counts as ints (``integer``), or a ``TypeError`` naming the one that isn't."""
    return integer(op, "num_kv_heads", num_kv_heads), integer(op, "num_heads", num_heads)


def check_inputs(
    op: str, names: tuple[str, str], a: Tensor, b: Tensor, num_kv_heads: int, num_heads: int
) -> None:
    """Raise a ``TypeError``/``ValueError``/``RuntimeError`` naming the argument if the op can't run.

    ``a`` and ``b`` are ``(k, v)`` for ``gqa_expand`` (head dim ``num_kv_heads``) and
    ``(grad_k, grad_v)`` for ``gqa_reduce`` (head dim ``num_heads``).
    """
    check_head_counts(op, num_kv_heads, num_heads)
    reduce = op == "gqa_reduce"
    check_tensor(op, names[0], a, reduce)
    check_tensor(op, names[1], b, reduce)
    if a.device != b.device:
        raise RuntimeError(
            f"{op}: {names[0]} and {names[1]} must be on one device, got {a.device} and {b.device}"
        )
    # Sizes and head counts may be symbols of a dynamic-shape trace.
    _require(num_kv_heads > 0, "{}: num_kv_heads must be positive, got {}", op, num_kv_heads)
    _require(num_heads > 0, "{}: num_heads must be positive, got {}", op, num_heads)
    _require(num_heads % num_kv_heads == 0,
             "{}: num_heads ({}) must be a multiple of num_kv_heads ({})", op, num_heads, num_kv_heads)  # fmt: skip
    head_arg, heads = ("num_heads", num_heads) if reduce else ("num_kv_heads", num_kv_heads)
    shape_a, shape_b = a.shape, b.shape
    _require(
        shape_a[1] == heads,
        "{}: {}.shape[1] ({}) must equal {} ({})",
        op,
        names[0],
        shape_a[1],
        head_arg,
        heads,
    )
    for dim, what in _DIMS:
        _require(shape_a[dim] == shape_b[dim], "{}: {} and {} must agree in the {} dim {}, got {} {} and {} {}",
                 op, names[0], names[1], what, dim, names[0], shape_a, names[1], shape_b)  # fmt: skip

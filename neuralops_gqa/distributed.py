"""``gqa_expand`` and ``gqa_reduce`` on DTensors: every placement, no communication.

Both ops copy or sum along the head dim only, so each rank can work on its own shard:

- ``Replicate``, ``Shard(0)`` (batch), ``Shard(2)`` (sequence), ``Shard(3)`` (head dim) and
  ``Partial`` (the ops are linear) keep the head counts: the local call is the global one
  on the local tensors.
- ``Shard(1)`` (heads) gives each rank ``num_kv_heads / ranks`` KV heads, which expand to
  exactly its ``num_heads / ranks`` query heads in interleave order, so the local call
  takes the local head counts.

The result keeps the input's placements. Head counts are always the global ones.

Why a DTensor op handler and not ``torch.distributed.tensor.experimental.register_sharding``:
a sharding rule can only choose placements; the local call would still receive the global
head counts, which a ``Shard(1)`` input contradicts. The handler translates them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from neuralops_gqa.ops import check_inputs


def _local_call(op: str, names: tuple[str, str], args: tuple[Any, ...]) -> tuple[Tensor, Tensor, int, int]:
    """Validate a DTensor call; return the local tensors and the local head counts."""
    a, b, num_kv_heads, num_heads = args
    for name, x in zip(names, (a, b)):
        if not isinstance(x, DTensor):
            raise RuntimeError(
                f"{op}: {names[0]} and {names[1]} must both be DTensors or both plain tensors, "
                f"got {type(x).__name__} for {name}"
            )
    check_inputs(op, names, a, b, num_kv_heads, num_heads)
    torch._check(
        a.device_mesh == b.device_mesh and a.placements == b.placements,
        lambda: (
            f"{op}: {names[0]} and {names[1]} must share one device mesh and placements, "
            f"got {a.placements} and {b.placements}"
        ),
    )
    split = 1
    for mesh_dim, placement in enumerate(a.placements):
        if isinstance(placement, Shard):
            if placement.dim % 4 == 1:
                split *= a.device_mesh.size(mesh_dim)
        elif not isinstance(placement, (Replicate, Partial)):
            raise ValueError(f"{op}: unsupported placement {placement} of {names[0]}")
    if split > 1:
        torch._check_value(
            num_kv_heads % split == 0,
            lambda: (
                f"{op}: num_kv_heads ({num_kv_heads}) must be divisible by the {split} ranks that "
                f"shard the head dim (Shard(1)) of {names[0]}"
            ),
        )
    return a.to_local(), b.to_local(), num_kv_heads // split, num_heads // split


def _wrap(local: Tensor, like: DTensor, heads: int) -> DTensor:
    """A DTensor over ``local`` with ``like``'s mesh and placements and ``heads`` global heads."""
    shape = torch.Size((like.shape[0], heads, like.shape[2], like.shape[3]))
    stride = (heads * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1)
    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=shape, stride=stride
    )


def _expand_handler(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[DTensor, DTensor]:
    k_local, v_local, kv_local, heads_local = _local_call("gqa_expand", ("k", "v"), args)
    out_k, out_v = op_call(k_local, v_local, kv_local, heads_local)
    num_heads = args[3]
    return _wrap(out_k, args[0], num_heads), _wrap(out_v, args[1], num_heads)


def _reduce_handler(op_call: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[DTensor, DTensor]:
    gk_local, gv_local, kv_local, heads_local = _local_call("gqa_reduce", ("grad_k", "grad_v"), args)
    out_k, out_v = op_call(gk_local, gv_local, kv_local, heads_local)
    num_kv_heads = args[2]
    return _wrap(out_k, args[0], num_kv_heads), _wrap(out_v, args[1], num_kv_heads)


def register() -> None:
    """Route both ops on DTensors through the handlers above (idempotent)."""
    handlers = DTensor._op_dispatcher._custom_op_handlers
    handlers[torch.ops.neuralops.gqa_expand.default] = _expand_handler
    handlers[torch.ops.neuralops.gqa_reduce.default] = _reduce_handler

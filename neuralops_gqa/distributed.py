"""``gqa_expand`` and ``gqa_reduce`` on DTensors: each tensor on its own placements.

Each output of either op depends on one input only (k's expansion on k, v's on v), and only
along the head dim, so each rank can work on its own shard of each tensor:

- ``Replicate``, ``Shard(0)`` (batch), ``Shard(2)`` (sequence) and ``Shard(3)`` (head dim)
  keep the head counts: the local call is the global one on the local tensors.
- ``Shard(1)`` (heads) gives each rank ``num_kv_heads / ranks`` KV heads, which expand to
  exactly its ``num_heads / ranks`` query heads in interleave order, so the local call
  takes the local head counts.
- ``Partial``: the expansion is a copy, so it commutes with every reduce op (sum, avg,
  max, min, product, ...) and keeps the placement. The reduction is a sum, which commutes
  with ``Partial("sum")`` and ``Partial("avg")`` only; any other reduce op is reduced
  across ranks first (``Replicate``), the only case that moves data.

Placements and meshes of k and v may differ (so may those of the two gradients that
autograd hands the backward): each result keeps its own input's placements. The two local
calls become one when the local shapes and head counts agree, as they do when the
placements match. Head counts are always the global ones; this module translates them.

Why ``torch.library.register_torch_dispatch`` and not
``torch.distributed.tensor.experimental.register_sharding``: a sharding rule can only
choose placements; the local call would still receive the global head counts, which a
``Shard(1)`` input contradicts, and k and v would be forced onto common placements. The
torch_dispatch rule sees the DTensors and translates the head counts.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from neuralops_gqa.transforms import NAMES
from neuralops_gqa.validation import check_inputs

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch.distributed.tensor import DTensor

_OPS = ("gqa_expand", "gqa_reduce")

# Partial reduce ops that commute with each op: a copy commutes with any elementwise
# reduction across ranks; a sum only with a sum (avg is a sum over a constant).
_COMMUTING_REDUCE_OPS: dict[str, frozenset[str] | None] = {
    "gqa_expand": None,  # every reduce op of a plain Partial
    "gqa_reduce": frozenset({"sum", "avg"}),
}

unavailable: str | None = None
"""Why DTensor inputs are refused on this torch, or None when they are supported."""


def _local(op: str, name: str, x: DTensor, num_kv_heads: int) -> tuple[DTensor, int]:
    """``x`` on placements the op commutes with, and the number of shards of its head dim.

    Allow-list: ``Replicate``, any ``Shard`` of dims 0, 2 and 3, a plain ``Shard(1)``, and a
    plain ``Partial`` whose reduce op commutes with ``op``. Any other placement of a mesh
    dim (another reduce op, a strided shard of the heads, a placement this module does not
    know) is replicated along that mesh dim first, which is what DTensor does for an aten
    op without a matching sharding strategy.
    """
    from torch.distributed.tensor import Partial, Replicate, Shard

    commuting = _COMMUTING_REDUCE_OPS[op]
    placements = list(x.placements)
    split = 1
    replicate = False
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Replicate):
            continue
        if isinstance(placement, Shard):
            if placement.dim % 4 != 1:  # the op is independent along batch, sequence and head dim
                continue
            if type(placement) is Shard:  # contiguous blocks of heads: whole groups per rank
                split *= x.device_mesh.size(mesh_dim)
                continue
        elif type(placement) is Partial and (commuting is None or placement.reduce_op in commuting):
            continue
        placements[mesh_dim] = Replicate()
        replicate = True
    if replicate:
        x = x.redistribute(x.device_mesh, placements)
    if split > 1:
        torch._check_value(
            num_kv_heads % split == 0,
            lambda: (
                f"{op}: num_kv_heads ({num_kv_heads}) must be divisible by the {split} ranks that "
                f"shard the head dim (Shard(1)) of {name}"
            ),
        )
    return x, split


def _wrap(local: Tensor, like: DTensor, heads: int) -> DTensor:
    """A DTensor over ``local`` with ``like``'s mesh and placements and ``heads`` global heads."""
    from torch.distributed.tensor import DTensor

    shape = torch.Size((like.shape[0], heads, like.shape[2], like.shape[3]))
    stride = (heads * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1)
    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=shape, stride=stride
    )


def _dtensor_rule(cls: type, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The torch_dispatch rule of both ops for DTensor: local calls, results rewrapped."""
    from torch.distributed.tensor import DTensor

    op = func._schema.name.split("::")[-1]
    names = NAMES[op]
    a, b, num_kv_heads, num_heads = (*args, *kwargs.values())
    for name, x in zip(names, (a, b)):
        if not isinstance(x, DTensor):
            raise RuntimeError(
                f"{op}: {names[0]} and {names[1]} must both be DTensors or both plain tensors, "
                f"got {type(x).__name__} for {name}"
            )
    check_inputs(op, names, a, b, num_kv_heads, num_heads)
    (a, split_a), (b, split_b) = _local(op, names[0], a, num_kv_heads), _local(op, names[1], b, num_kv_heads)
    local_a, local_b = a.to_local(), b.to_local()
    if split_a == split_b and local_a.shape[:3] == local_b.shape[:3]:
        out_a, out_b = func(local_a, local_b, num_kv_heads // split_a, num_heads // split_a)
    else:
        # Different local shapes or head counts: one call per tensor, each with a local
        # zero-width stand-in for the other (it passes the checks and costs nothing).
        out_a, _ = func(local_a, local_a[..., :0], num_kv_heads // split_a, num_heads // split_a)
        _, out_b = func(local_b[..., :0], local_b, num_kv_heads // split_b, num_heads // split_b)
    heads = num_heads if op == "gqa_expand" else num_kv_heads
    return _wrap(out_a, a, heads), _wrap(out_b, b, heads)


def _refuse(reason: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"neuralops_gqa: DTensor inputs are not supported on torch {torch.__version__}: {reason}"
        )

    return refuse


def _register_refusal(reason: str) -> None:
    """Make DTensor's own fallback, a sharding rule, raise ``reason`` instead of its generic error."""
    try:
        from torch.distributed.tensor.experimental import register_sharding

        for name in _OPS:
            register_sharding(getattr(torch.ops.neuralops, name).default)(_refuse(reason))
    except Exception:  # a hint only: DTensor's generic error is what is left
        pass


class _RegisteringLoader(importlib.abc.Loader):
    """``loader``, plus ``register()`` right after it has executed ``torch.distributed.tensor``.

    Only the spec that ``_RegisterOnImport`` returns holds it; the module gets its own loader
    back before its code runs, so nothing that inspects the module sees this one.
    """

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        self.loader.exec_module(module)
        register()

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, resource readers, ...
        return getattr(self.loader, name)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Has ``register()`` run whenever ``torch.distributed.tensor`` is executed: its first
    import, a ``spec.loader.exec_module`` by hand, an ``importlib.reload``.

    DTensor costs about half a second to import, which ``import neuralops_gqa`` shouldn't
    pay for a program that never makes one, and no DTensor can exist before that module
    has run. The finder stays on ``sys.meta_path`` and wraps the loader of every spec it
    hands out, a fresh one per lookup: a caller that looks the module up and discards the
    spec (``importlib.util.find_spec``, ``torch._logging.set_logs``) leaves the next import
    covered. Every other module's lookup costs one string comparison.
    """

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != DTENSOR_MODULE:
            return None
        # The spec the finders after this one find, as an import without it would get.
        finders = sys.meta_path
        later = finders[finders.index(self) + 1 :] if self in finders else finders
        for finder in later:
            find_spec = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                None if find_spec is None else find_spec(name, path, target)
            )
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


DTENSOR_MODULE = "torch.distributed.tensor"


def register_on_import() -> None:
    """``register()`` now if DTensor is already imported, and whenever its module runs again."""
    if not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
    if DTENSOR_MODULE in sys.modules:
        register()


_lock = threading.RLock()  # reentrant: importing DTensor from register() runs register() again
_registered_for: type | None = None
"""The DTensor class the rule was registered for (or failed to be); a reload can make another."""


def registered() -> bool:
    """Whether DTensor calls of both ops reach ``_dtensor_rule`` (False before DTensor is imported)."""
    dtensor = getattr(sys.modules.get(DTENSOR_MODULE), "DTensor", None)
    return dtensor is not None and dtensor is _registered_for and unavailable is None


def register() -> None:
    """Route both ops on DTensors through ``_dtensor_rule`` (once per DTensor class; later calls
    do nothing).

    Never raises: on a torch without the public extension point it warns once, and a
    DTensor call then raises an error that names what is missing. The same error, with
    another reason, stands behind the rule should a torch dispatch DTensors to sharding
    rules without consulting it.
    """
    global _registered_for, unavailable
    with _lock:
        try:
            from torch.distributed.tensor import DTensor

            if DTensor is _registered_for:
                return
            _registered_for = DTensor
            for name in _OPS:
                torch.library.register_torch_dispatch(f"neuralops::{name}", DTensor, _dtensor_rule)
        except Exception as exc:  # importing the package must not fail on a torch that moved
            if unavailable is None:
                unavailable = (
                    f"registering a DTensor rule with torch.library.register_torch_dispatch failed ({exc!r})"
                )
                warnings.warn(
                    f"neuralops_gqa: DTensor inputs will raise an error: {unavailable}",
                    RuntimeWarning,
                    stacklevel=2,
                )
                _register_refusal(unavailable)
            return
        unavailable = None
        _register_refusal(
            "DTensor's dispatch did not call the rule registered with torch.library.register_torch_dispatch"
        )

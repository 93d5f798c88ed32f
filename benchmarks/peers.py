"""Our op and its peers as users run them, for both tensors of a model's attention.

Hugging Face's ``repeat_kv`` keeps its real output (with one KV head a broadcast view, no
copy at all); its backward is what autograd runs for it (the reshape's view, the expand's
sum over the group); ``compiled(...)`` is ``torch.compile`` of a peer. Not for: timing them
(:mod:`benchmarks.timing`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

import neuralops_gqa  # noqa: F401  (registers the ops)
from neuralops_gqa.selfcheck import hf_repeat_kv

Pair = tuple[Tensor, Tensor]
EXPAND = torch.ops.neuralops.gqa_expand
REDUCE = torch.ops.neuralops.gqa_reduce


def ours(k: Tensor, v: Tensor, n_rep: int) -> Pair:
    out: Pair = EXPAND(k, v, k.shape[1], k.shape[1] * n_rep)
    return out


def ours_backward(gk: Tensor, gv: Tensor, n_rep: int) -> Pair:
    out: Pair = REDUCE(gk, gv, gk.shape[1] // n_rep, gk.shape[1])
    return out


def hf(k: Tensor, v: Tensor, n_rep: int) -> Pair:
    return hf_repeat_kv(k, n_rep), hf_repeat_kv(v, n_rep)


def hf_backward(gk: Tensor, gv: Tensor, n_rep: int) -> Pair:
    b, h, n, _ = gk.shape
    return gk.view(b, h // n_rep, n_rep, n, -1).sum(2), gv.view(b, h // n_rep, n_rep, n, -1).sum(2)


def interleave(k: Tensor, v: Tensor, n_rep: int) -> Pair:
    return k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)


# What torch.compile gets: functions of their own, so compilations never share a code
# object's cache with the eager peers.
def hf_for_compile(k: Tensor, v: Tensor, n_rep: int) -> Pair:
    return hf(k, v, n_rep)


def hf_backward_for_compile(gk: Tensor, gv: Tensor, n_rep: int) -> Pair:
    return hf_backward(gk, gv, n_rep)


@functools.cache
def compiled(fn: Callable[..., Any], mode: str = "default", backend: str = "inductor") -> Callable[..., Any]:
    """``torch.compile`` of ``fn``, made on first use and kept for the run (one graph per
    shape and dtype); ``backend="eager"`` only traces, for smoke tests."""
    if backend != "inductor":
        return torch.compile(fn, backend=backend, dynamic=False, fullgraph=True)
    return torch.compile(fn, mode=mode, dynamic=False, fullgraph=True)


@contextlib.contextmanager
def recompile_limits_lifted() -> Iterator[None]:
    """Lift dynamo's recompile cap for a run that compiles one graph per shape (so none falls
    back to eager), and put it back afterwards."""
    config = torch._dynamo.config
    names = (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    )
    saved = {n: getattr(config, n) for n in names if hasattr(config, n)}
    try:
        for name in saved:
            setattr(config, name, 1024)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def forward_peers(
    kv_heads: int, device: str, compiled_peers: bool, backend: str
) -> dict[str, Callable[..., Pair]]:
    """The forward's providers. With one KV head Hugging Face's ``repeat_kv`` is a view (no
    kernel), compiled or not: the attention blocks time it with its consumer."""
    providers: dict[str, Callable[..., Pair]] = {"neuralops": ours, "repeat_interleave": interleave}
    if kv_heads > 1:
        providers["hf_eager"] = hf
        if compiled_peers and (device == "cuda" or backend != "inductor"):
            providers["compiled_hf"] = compiled(hf_for_compile, backend=backend)
    return providers


def backward_peers(device: str, compiled_peers: bool, backend: str) -> dict[str, Callable[..., Pair]]:
    """The backward's kernel work (the autograd engine's host cost left out for all alike)."""
    providers: dict[str, Callable[..., Pair]] = {"neuralops": ours_backward, "hf_eager": hf_backward}
    if compiled_peers and (device == "cuda" or backend != "inductor"):
        providers["compiled_hf"] = compiled(hf_backward_for_compile, backend=backend)
    return providers

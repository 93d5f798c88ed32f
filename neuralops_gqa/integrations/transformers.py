"""Hugging Face transformers attention whose KV head expansion is ``torch.ops.neuralops.gqa_expand``.

Two attention implementations, selectable by name once :func:`register` has run:

- ``"neuralops_sdpa"``: transformers' ``"sdpa"``, with our op where it would copy in ``repeat_kv``.
- ``"neuralops_eager"``: transformers' ``"eager"``, with our op in place of ``repeat_kv``.

Use::

    import neuralops_gqa.integrations.transformers as neuralops_transformers

    neuralops_transformers.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="neuralops_sdpa")
    model.set_attn_implementation("neuralops_eager")  # an existing model switches too

Importing this module registers nothing, so the one change it makes to transformers'
global registries is a call the reader can see. :func:`register` adds both names to
``AttentionInterface`` and ``AttentionMaskInterface``; calling it again changes nothing.

Both run transformers' own attention function (its SDPA one, or the layer's own eager
one) on k and v that our op has already expanded, with the layer seen through a stand-in
that reports one KV group, so the function's own ``repeat_kv`` has nothing left to do.
The expansion is an exact copy, so the attention sees the bits ``repeat_kv`` would give
it: outputs equal the stock implementations' for every model family, whatever its eager
attention computes (where a model decides by comparing the name with the literal
``"sdpa"`` or ``"eager"`` and would hand these functions what the stock ones never get,
they raise ``NotImplementedError`` instead); gradients differ at most by the float32 rounding of the group sum
(``docs/usage/transformers.md``). Where stock makes no copy of its own our op runs neither:
SDPA's ``enable_gqa``, a single decoding query, and one KV head, whose broadcast view
(stride 0 over the heads) reaches the attention as stock hands it, so its bits are stock's
on any machine.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations import sdpa_attention as _stock_sdpa
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from neuralops_gqa.functional import gqa_expand

SDPA = "neuralops_sdpa"
"""The ``attn_implementation`` name of ``sdpa_attention_forward``, once ``register()`` ran."""
EAGER = "neuralops_eager"
"""The ``attn_implementation`` name of ``eager_attention_forward``, once ``register()`` ran."""

# transformers >= 5.23 attends a single decoding query on the KV heads themselves
# (``pack_gqa``) instead of repeating them; there is nothing for our op to do then.
_STOCK_PACKS_DECODING_QUERY = hasattr(_stock_sdpa, "pack_gqa")
# transformers 5.19-5.23 write a paged (continuous batching) cache inside sdpa, before the
# expansion: such calls go to the stock function unchanged, so the cache keeps KV heads only.
_STOCK_WRITES_PAGED_CACHE = "cache" in inspect.signature(_stock_sdpa.sdpa_attention_forward).parameters


def register() -> None:
    """Make ``"neuralops_sdpa"`` and ``"neuralops_eager"`` valid ``attn_implementation`` names.

    Each gets the attention mask its stock counterpart gets (``"sdpa"``'s boolean mask, or
    none for a plain causal batch; ``"eager"``'s additive float mask): transformers builds no
    mask at all for a name without a mask function. Calling it again changes nothing.
    """
    AttentionInterface.register(SDPA, sdpa_attention_forward)
    AttentionInterface.register(EAGER, eager_attention_forward)
    AttentionMaskInterface.register(SDPA, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    AttentionMaskInterface.register(EAGER, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def _stock_sdpa_copies_kv(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None
) -> bool:
    """Whether transformers' own sdpa of the installed version would copy KV heads in
    ``repeat_kv`` here."""
    if getattr(module, "num_key_value_groups", 1) <= 1 or key.shape[1] == 1:
        return False  # nothing to repeat, or one KV head: a broadcast view SDPA reads in place
    if _stock_sdpa.use_gqa_in_sdpa(mask, key, value):  # SDPA's enable_gqa=True, no copy
        return False
    return not (_STOCK_PACKS_DECODING_QUERY and query.shape[2] == 1 and not torch.compiler.is_compiling())


def sdpa_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' ``"sdpa"`` attention with the KV heads expanded by ``gqa_expand``.

    Our op runs exactly where the installed transformers' ``sdpa_attention_forward`` would
    copy in ``repeat_kv``: when the module has ``num_key_value_groups > 1``, more than one
    KV head, and transformers rules SDPA's ``enable_gqa`` out (on CUDA and CPU: an attention
    mask is given, as for a padded batch or a sliding window, or the k and v head dims
    differ or exceed 256). Where the stock function uses ``enable_gqa=True`` (e.g. an
    unpadded causal batch), from transformers 5.23 attends a single decoding query on the
    KV heads, or has one KV head (its ``repeat_kv`` then returns a broadcast view that SDPA
    reads in place), nothing is expanded, as there. Everything else (``dropout``, ``scaling``, ``is_causal``, the
    ``position_bias`` of some encoders, cropping a static cache, backend-specific mask
    handling, the ``softcap`` check) is the stock function itself, called with the
    expanded k and v, so every argument means exactly what it means for ``"sdpa"``.

    Args:
        module: the attention layer; ``num_key_value_groups`` and ``is_causal`` are read.
        query: ``[B, H, N_q, D]``.
        key: ``[B, H_kv, N_kv, D]``.
        value: ``[B, H_kv, N_kv, D_v]``.
        attention_mask: boolean or additive ``[B or 1, 1, N_q, N_kv]``, or ``None``.

    Returns:
        ``(attn_output, None)``, ``attn_output`` being ``[B, N_q, H, D_v]``: SDPA returns
        no attention weights.
    """
    _refuse_what_stock_names_would_change(SDPA, module, query, key, attention_mask, kwargs)
    if _stock_sdpa_copies_kv(module, query, key, value, attention_mask) and not (
        _STOCK_WRITES_PAGED_CACHE and kwargs.get("cache") is not None
    ):
        kv_heads = key.shape[1]
        groups = cast(int, module.num_key_value_groups)
        key, value = gqa_expand(key, value, kv_heads, kv_heads * groups)
        module = _OneKVGroup(module)  # type: ignore[assignment]
    return _stock_sdpa.sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


# Layer class -> whether its model cuts KV-shared layers' queries by the attention's name.
_CUTS_QUERIES: dict[type, bool] = {}


def _cuts_queries(layer: type) -> bool:
    """Whether the model of a layer class cuts its KV-shared layers' queries to the kept
    logits (Gemma 4's ``_maybe_slice_kv_shared_inputs``), looked up once per class. Other
    KV-shared models (Gemma 3n) give such a layer fewer queries than keys and no mask only
    when decoding, which SDPA attends as stock does."""
    if layer not in _CUTS_QUERIES:
        found = vars(sys.modules[layer.__module__]).values() if layer.__module__ in sys.modules else ()
        _CUTS_QUERIES[layer] = any(
            isinstance(c, type) and hasattr(c, "_maybe_slice_kv_shared_inputs") for c in found
        )
    return _CUTS_QUERIES[layer]


_model_cuts_queries: Callable[[type], bool] = torch.compiler.assume_constant_result(_cuts_queries)


def _refuse_what_stock_names_would_change(
    name: str, module: nn.Module, query: Tensor, key: Tensor, mask: Tensor | None, kwargs: dict[str, Any]
) -> None:
    """Raise where a model decided something by comparing its attention name with the literal
    ``"sdpa"`` or ``"eager"`` and handed this call what the stock function, under its own
    name, never gets, so its result would silently differ from stock's:

    - sparse-attention indices (DeepSeek-V3.2-style indexers): under the stock names the
      model masks the keys the indexer left out; under any other it passes ``indices``,
      which the stock functions ignore, attending densely;
    - a KV-shared layer's queries cut to the last tokens without a mask (Gemma 4 with
      ``logits_to_keep`` above 1): the model cuts them under any name but ``"sdpa"``, and
      SDPA's causal flag then aligns them with the first keys. Its eager attention always
      gets a mask, so only ``"neuralops_sdpa"`` refuses it. One kept query is what stock
      gets too, except with a static cache (docs/usage/transformers.md).
    """
    if kwargs.get("indices") is not None:
        raise NotImplementedError(
            f'attn_implementation="{name}": this layer ({type(module).__name__}) passes sparse-attention '
            'indices, which transformers applies as a mask only under "sdpa" and "eager"; use those for this model'
        )
    if (
        name == SDPA
        and mask is None
        and 1 < query.shape[2] < key.shape[2]  # one query with no mask: a decoding step, as in stock
        and _model_cuts_queries(type(module))
        and getattr(module, "is_kv_shared_layer", False)
    ):
        raise NotImplementedError(
            f'attn_implementation="{name}": this KV-shared layer ({type(module).__name__}) got {query.shape[2]} '
            f"queries for {key.shape[2]} keys and no mask: transformers cuts its queries without a mask under any "
            'name but "sdpa", which SDPA would align with the first keys; use "sdpa" or "neuralops_eager" for this model'
        )


class _OneKVGroup:
    """The attention layer as its attention function sees it once k and v are expanded:
    ``num_key_value_groups`` is 1 (so ``repeat_kv`` returns its input), every other
    attribute is the layer's own (``training``, ``is_causal``, ``head_dim``, ``sinks``, ...)."""

    num_key_value_groups = 1

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.module, name)


def _own_eager_attention(layer: type) -> Callable[..., Any] | None:
    """The eager attention a transformers attention layer falls back to when its config names
    no registered implementation: the ``*eager_attention_forward`` its ``forward`` refers to,
    else its modeling file's ``eager_attention_forward``."""
    forward = inspect.unwrap(getattr(layer, "forward", None))  # type: ignore[arg-type]
    code = getattr(forward, "__code__", None)
    if code is not None:
        named = {name for name in code.co_names if name.endswith("eager_attention_forward")}
        if len(named) == 1:
            found = forward.__globals__.get(named.pop())
            return found if callable(found) else None
    found = getattr(sys.modules.get(layer.__module__), "eager_attention_forward", None)
    return found if callable(found) else None


# Layer class -> its own eager attention. A dict that compiled code reads (a lookup traces;
# inspecting code objects does not).
_EAGER: dict[type, Callable[..., Any]] = {}


def _find_eager(layer: type) -> bool:
    """Fill ``_EAGER[layer]`` once per layer class; an error if the layer has no eager attention.
    Under torch.compile the call is a constant of the graph, run when the graph is traced."""
    if layer not in _EAGER:
        own = _own_eager_attention(layer)
        if own is None:
            raise NotImplementedError(
                f'attn_implementation="{EAGER}": cannot find the eager attention of '
                f'{layer.__module__}.{layer.__qualname__}; use "{SDPA}" or "eager" for this model'
            )
        _EAGER[layer] = own
    return True


_found_eager: Callable[[type], bool] = torch.compiler.assume_constant_result(_find_eager)


def eager_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """The layer's own eager attention (what ``"eager"`` runs for it) on k and v expanded by
    ``gqa_expand``.

    Every argument goes to that function unchanged (``scaling``, ``dropout``, ``softcap``,
    sliding windows, sinks, ...), so the results are the stock ones bit for bit. The op
    expands wherever the stock function's ``repeat_kv`` would copy: every layer with more
    than one KV head and more query than KV heads. With one KV head ``repeat_kv`` returns a
    broadcast view (stride 0 over the heads) and nothing is expanded here either: the
    layer's own ``repeat_kv`` makes that view and ``torch.matmul`` gets it as in stock,
    because ``matmul`` of the view and of a contiguous copy may round differently on some
    CPUs. A layer whose eager attention cannot be found raises ``NotImplementedError``.

    Args:
        module: the attention layer; ``num_key_value_groups`` is read, the rest by its own
            attention function.
        query: ``[B, H, N_q, D]``.
        key: ``[B, H_kv, N_kv, D]``.
        value: ``[B, H_kv, N_kv, D_v]``.
        attention_mask: additive ``[B or 1, 1, N_q, N_kv]`` (transformers' eager mask), or ``None``.

    Returns:
        What the layer's eager attention returns: ``(attn_output, attn_weights)``,
        ``[B, N_q, H, D_v]`` and ``[B, H, N_q, N_kv]``.
    """
    _refuse_what_stock_names_would_change(EAGER, module, query, key, attention_mask, kwargs)
    _found_eager(type(module))
    own = _EAGER[type(module)]
    groups = cast(int, getattr(module, "num_key_value_groups", 1))
    kv_heads = key.shape[1]
    # One KV head: the layer's repeat_kv makes stock's broadcast view (see the docstring).
    if groups > 1 and kv_heads > 1:
        key, value = gqa_expand(key, value, kv_heads, kv_heads * groups)
        module = _OneKVGroup(module)  # type: ignore[assignment]
    return cast("tuple[Tensor, Tensor]", own(module, query, key, value, attention_mask, **kwargs))

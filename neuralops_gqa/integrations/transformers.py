"""Hugging Face transformers attention whose KV head expansion is ``torch.ops.neuralops.gqa_expand``.

Two attention implementations, selectable by name once :func:`register` has run:

- ``"neuralops_sdpa"``: transformers' ``"sdpa"``, with our op in place of ``repeat_kv``.
- ``"neuralops_eager"``: transformers' ``"eager"``, with our op in place of ``repeat_kv``.

Use::

    import neuralops_gqa.integrations.transformers as neuralops_transformers

    neuralops_transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="neuralops_sdpa")
    model.set_attn_implementation("neuralops_eager")  # an existing model switches too

Importing this module registers nothing, so the one change it makes to transformers'
global registries is a call the reader can see. :func:`register` adds both names to
``AttentionInterface`` and ``AttentionMaskInterface``; calling it again changes nothing.

The expansion is an exact copy, so the attention sees the bits ``repeat_kv`` would give
it: outputs equal the stock implementations'; gradients differ at most by the float32
rounding of the group sum (``docs/usage/transformers.md``). Not for models whose own eager
attention computes something other than the Llama family's (Llama, Mistral, Qwen2/3),
Gemma 2/3's soft-capped one or GPT-OSS's with sinks: give those ``"neuralops_sdpa"`` or
their stock implementation.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations import sdpa_attention as _stock_sdpa
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from neuralops_gqa.functional import gqa_expand

SDPA = "neuralops_sdpa"
EAGER = "neuralops_eager"

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


class _AllHeads:
    """What transformers' sdpa reads of an attention module (``num_key_value_groups``,
    ``is_causal``), for k and v that already have one head per query head."""

    num_key_value_groups = 1

    def __init__(self, is_causal: bool) -> None:
        self.is_causal = is_causal


# Two constants rather than a new object per call: torch.compile guards on them as constants.
_ALL_HEADS = {True: _AllHeads(True), False: _AllHeads(False)}


def _stock_sdpa_repeats_kv(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None
) -> bool:
    """Whether transformers' own sdpa of the installed version would call ``repeat_kv`` here."""
    if getattr(module, "num_key_value_groups", 1) <= 1:
        return False
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
    call ``repeat_kv``: when the module has ``num_key_value_groups > 1`` and transformers
    rules SDPA's ``enable_gqa`` out (on CUDA and CPU: an attention mask is given, as for a
    padded batch or a sliding window, or the k and v head dims differ or exceed 256).
    Where the stock function uses ``enable_gqa=True`` (e.g. an unpadded causal batch) or,
    from transformers 5.23, attends a single decoding query on the KV heads, nothing is
    expanded, as there. Everything else (``dropout``, ``scaling``, ``is_causal``, the
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
    if _stock_sdpa_repeats_kv(module, query, key, value, attention_mask) and not (
        _STOCK_WRITES_PAGED_CACHE and kwargs.get("cache") is not None
    ):
        kv_heads = key.shape[1]
        groups = cast(int, module.num_key_value_groups)
        key, value = gqa_expand(key, value, kv_heads, kv_heads * groups)
        module = _ALL_HEADS[bool(getattr(module, "is_causal", True))]  # type: ignore[assignment]
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


def eager_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """transformers' ``"eager"`` attention (matmul, additive mask, float32 softmax, matmul)
    with the KV heads expanded by ``gqa_expand``, always, as the stock one calls ``repeat_kv``
    always.

    The arithmetic is, operation for operation, the ``eager_attention_forward`` of the
    Llama, Mistral, Qwen2/3 and Gemma 2/3 modeling files, and with ``s_aux`` GPT-OSS's.
    ``is_causal`` and ``sliding_window`` arrive in ``kwargs`` and are ignored, as there:
    the eager mask already holds causality and the window.

    Args:
        module: the attention layer; ``num_key_value_groups``, ``training`` and, when
            ``scaling`` is ``None``, ``head_dim`` are read.
        query: ``[B, H, N_q, D]``.
        key: ``[B, H_kv, N_kv, D]``.
        value: ``[B, H_kv, N_kv, D_v]``.
        attention_mask: additive ``[B or 1, 1, N_q, N_kv]`` (transformers' eager mask), or ``None``.
        scaling: the logit scale; ``None`` means ``module.head_dim ** -0.5`` (Gemma's default).
        dropout: dropout probability on the attention weights, applied in training mode only.
        softcap: if given, logits become ``softcap * tanh(logits / softcap)`` before the mask (Gemma 2/3).
        s_aux: ``[H]`` attention sink logits (GPT-OSS): a per-head extra logit that takes
            softmax mass and is then dropped; the softmax runs in the logits' dtype, as there.

    Returns:
        ``(attn_output, attn_weights)``: ``[B, N_q, H, D_v]`` and ``[B, H, N_q, N_kv]``.
    """
    if scaling is None:
        scaling = cast(int, module.head_dim) ** -0.5
    kv_heads = key.shape[1]
    groups = cast(int, module.num_key_value_groups)
    key, value = gqa_expand(key, value, kv_heads, kv_heads * groups)
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if attention_mask is not None:
        logits = logits + attention_mask
    if s_aux is None:
        weights = F.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
        weights = F.dropout(weights, p=dropout, training=module.training)
    else:
        sinks = s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[2], -1)
        with_sinks = torch.cat([logits, sinks], dim=-1)
        # Shifted by the row max in the logits' own dtype, as GPT-OSS does against bf16 overflow.
        with_sinks = with_sinks - with_sinks.max(dim=-1, keepdim=True).values
        weights = F.softmax(with_sinks, dim=-1, dtype=with_sinks.dtype)[..., :-1]
        weights = F.dropout(weights, p=dropout, training=module.training).to(value.dtype)
    attn_output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return attn_output, weights

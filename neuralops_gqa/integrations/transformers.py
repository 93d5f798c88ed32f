"""Hugging Face transformers attention whose KV head expansion is ``torch.ops.neuralops.gqa_expand``.

Two attention implementations, selectable by name once :func:`register` has run:

- ``"neuralops_sdpa"``: transformers' ``"sdpa"``, with our op in place of ``repeat_kv``.
- ``"neuralops_eager"``: transformers' ``"eager"``, with our op in place of ``repeat_kv``.

Use::

    import neuralops_gqa.integrations.transformers as neuralops_transformers

    neuralops_transformers.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="neuralops_sdpa")
    model.set_attn_implementation("neuralops_eager")  # an existing model switches too

Importing this module registers nothing, so the one change it makes to transformers'
global registries is a call the reader can see. :func:`register` adds both names to
``AttentionInterface`` and ``AttentionMaskInterface``; calling it again changes nothing.

The expansion is an exact copy, so the attention sees the bits ``repeat_kv`` would give
it: outputs equal the stock implementations'; gradients differ at most by the float32
rounding of the group sum (``docs/usage/transformers.md``). ``"neuralops_eager"`` checks
each attention layer class's own eager attention on its first call: where that is not one
it reproduces (the Llama family's, Gemma 2/3's soft-capped one, GPT-OSS's with sinks), the
layer runs its own, with a warning.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
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


# The eager attentions "neuralops_eager" reproduces, by the fingerprint of their source (see
# _fingerprint): the arithmetic below was written against these functions and the tests
# compare it with them. Source with another fingerprint is never assumed to compute the
# same thing: such a layer runs its own eager attention (see _resolve).
_LLAMA = "llama"  # matmul, scale, additive mask, float32 softmax, dropout, matmul
_SOFTCAP = "softcap"  # the same with Gemma 2's logit soft-capping and scaling=None allowed
_SINKS = "sinks"  # the same with GPT-OSS's attention sinks (module.sinks), softmax in the logits' dtype
_OWN = "own"  # anything else: the layer's own eager attention runs, without our op
_KNOWN_FORMS = {
    # Llama, Mistral, Qwen2/3, Phi-3 and about 170 more modeling files (transformers 5.17.0, 5.24.0 and 5.25.0).
    "a747d51fb9a1a4a2": _LLAMA,
    # Gemma 2/3/3n/4, VaultGemma, T5Gemma (transformers 5.17.0, 5.24.0 and 5.25.0).
    "1929b85b516dc58c": _SOFTCAP,
    # GPT-OSS, DeepSeek-V4, HunYuan-V4 (transformers 5.17.0, 5.24.0 and 5.25.0).
    "b8862e7f17e6ffec": _SINKS,
}


def _fingerprint(function: Callable[..., Any]) -> str | None:
    """A short hash of a function's source with what cannot change its arithmetic removed
    (formatting, comments, docstring, type annotations, its own name); ``None`` without source."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return None
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef):
        return None
    node.name = "f"
    node.returns = None
    docstring = node.body[0] if node.body else None
    if isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant):
        node.body = node.body[1:]
    for arg in ast.walk(node.args):
        if isinstance(arg, ast.arg):
            arg.annotation = None
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()[:16]


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


# Layer class -> its own eager attention, for the layers whose eager attention is not one of
# _KNOWN_FORMS. A dict that compiled code reads (a dict lookup traces; inspect does not).
_OWN_EAGER: dict[type, Callable[..., Any]] = {}
_FORMS: dict[type, str] = {}


def _resolve_form(layer: type) -> str:
    """Which of _KNOWN_FORMS the layer's own eager attention is, or ``_OWN``; once per layer
    class, warning once where the layer keeps its own. Under torch.compile the answer is a
    constant of the graph, so inspecting the source happens outside it."""
    form = _FORMS.get(layer)
    if form is not None:
        return form
    own = _own_eager_attention(layer)
    if own is None:
        raise NotImplementedError(
            f'attn_implementation="{EAGER}": cannot find the eager attention of '
            f"{layer.__module__}.{layer.__qualname__}, so cannot check that {EAGER} computes what it "
            f'computes; use "{SDPA}" or "eager" for this model'
        )
    form = _KNOWN_FORMS.get(_fingerprint(own) or "", _OWN)
    if form == _OWN:
        _OWN_EAGER[layer] = own
        warnings.warn(
            f'attn_implementation="{EAGER}": {layer.__qualname__} computes its eager attention '
            f"({own.__module__}.{own.__qualname__}) in a way {EAGER} does not reproduce (it reproduces "
            f"Llama's, Gemma 2's soft-capped one and GPT-OSS's with sinks), so that layer runs its own "
            f'eager attention (the stock results, without gqa_expand); "{SDPA}" may use the op there.',
            stacklevel=2,
        )
    _FORMS[layer] = form
    return form


_resolve: Callable[[type], str] = torch.compiler.assume_constant_result(_resolve_form)


def eager_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """transformers' ``"eager"`` attention (matmul, additive mask, float32 softmax, matmul)
    with the KV heads expanded by ``gqa_expand``, always, as the stock one calls ``repeat_kv``
    always, for layers whose own eager attention it reproduces; other layers run their own.

    On a layer class's first call it reads the source of the eager attention that layer
    would run under ``"eager"`` (the ``eager_attention_forward`` of its modeling file) and
    compares it with the ones this function reproduces operation for operation: the Llama
    family's (Llama, Mistral, Qwen2/3 and most decoder models), Gemma 2/3's (``softcap``,
    ``scaling=None`` meaning ``head_dim ** -0.5``) and GPT-OSS's (attention sinks read from
    ``module.sinks``, softmax in the logits' dtype). A layer whose eager attention is another
    one (Granite-SWA's sinks applied as an output scale, Llama 4's softmax in the input
    dtype, encoders' own masks, ...) gets that function, called with the same arguments,
    and a warning once: the results are the stock ones, without our op. Where the layer's
    eager attention cannot be found this raises ``NotImplementedError``.

    Args:
        module: the attention layer; ``num_key_value_groups``, ``training`` and, when
            ``scaling`` is ``None``, ``head_dim`` are read (``sinks`` for GPT-OSS's form).
        query: ``[B, H, N_q, D]``.
        key: ``[B, H_kv, N_kv, D]``.
        value: ``[B, H_kv, N_kv, D_v]``.
        attention_mask: additive ``[B or 1, 1, N_q, N_kv]`` (transformers' eager mask), or ``None``.
        scaling: the logit scale; ``None`` means ``module.head_dim ** -0.5`` (Gemma's default).
        dropout: dropout probability on the attention weights, applied in training mode only.
        softcap: for Gemma 2/3's form, logits become ``softcap * tanh(logits / softcap)``
            before the mask; ignored by the other forms, as there.

    Returns:
        ``(attn_output, attn_weights)``: ``[B, N_q, H, D_v]`` and ``[B, H, N_q, N_kv]``.
    """
    form = _resolve(type(module))
    if form == _OWN:
        if softcap is not None:  # passed on only when given, as the caller gave it
            kwargs["softcap"] = softcap
        own = _OWN_EAGER[type(module)]
        output = own(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        return cast("tuple[Tensor, Tensor]", output)
    if scaling is None:
        scaling = cast(int, module.head_dim) ** -0.5
    kv_heads = key.shape[1]
    groups = cast(int, module.num_key_value_groups)
    key, value = gqa_expand(key, value, kv_heads, kv_heads * groups)
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    if form == _SOFTCAP and softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if attention_mask is not None:
        logits = logits + attention_mask
    if form != _SINKS:
        weights = F.softmax(logits, dim=-1, dtype=torch.float32).to(query.dtype)
        weights = F.dropout(weights, p=dropout, training=module.training)
    else:
        sinks = cast(Tensor, module.sinks).reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[2], -1)
        with_sinks = torch.cat([logits, sinks], dim=-1)
        # Shifted by the row max in the logits' own dtype, as GPT-OSS does against bf16 overflow.
        with_sinks = with_sinks - with_sinks.max(dim=-1, keepdim=True).values
        weights = F.softmax(with_sinks, dim=-1, dtype=with_sinks.dtype)[..., :-1]
        weights = F.dropout(weights, p=dropout, training=module.training).to(value.dtype)
    attn_output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return attn_output, weights

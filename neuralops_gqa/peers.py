"""The expansions the op is measured against: Hugging Face's eager ``repeat_kv``."""

from __future__ import annotations

from torch import Tensor


def hf_repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """Hugging Face's eager formulation: a broadcast view, then a reshape that copies."""
    batch, kv_heads, seq, dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, dim)

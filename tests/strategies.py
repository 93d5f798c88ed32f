"""Hypothesis strategies for the op's inputs, in one place."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from helpers import FORWARD_DTYPES, GRAD_DTYPES, LAYOUTS, case_id

# Head dims worth hitting on purpose: 1, odd sizes, the non-powers of two real models use.
HEAD_DIMS = st.one_of(st.sampled_from([1, 3, 64, 80, 96, 128, 192, 256]), st.integers(1, 40))


@dataclass(frozen=True)
class Case:
    batch: int
    kv_heads: int
    n_rep: int
    seq: int
    dim_k: int
    dim_v: int
    dtype_k: torch.dtype
    dtype_v: torch.dtype
    layout_k: str
    layout_v: str
    seed: int

    @property
    def num_heads(self) -> int:
        return self.kv_heads * self.n_rep

    def __repr__(self) -> str:
        k = case_id(self.batch, self.kv_heads, self.n_rep, self.seq, self.dim_k, self.dtype_k, self.layout_k)
        return f"{k}/Dv{self.dim_v}-{self.dtype_v}-{self.layout_v}"


@st.composite
def cases(draw: st.DrawFn, dtypes: tuple[torch.dtype, ...] = FORWARD_DTYPES, max_elems: int = 6000) -> Case:
    """Shapes (empty ones included), strides, offsets and dtypes, kept small for the interpreter."""
    batch = draw(st.integers(0, 3))
    kv_heads = draw(st.integers(1, 4))
    n_rep = draw(st.sampled_from([1, 2, 3, 4, 7, 8]))
    seq = draw(st.integers(0, 40))
    dim_k = draw(HEAD_DIMS)
    dim_v = draw(st.one_of(st.just(dim_k), HEAD_DIMS))
    # Keep the biggest output small enough for the interpreter.
    while batch * kv_heads * n_rep * seq * max(dim_k, dim_v) > max_elems and seq > 1:
        seq //= 2
    dtype_k = draw(st.sampled_from(dtypes))
    dtype_v = draw(st.one_of(st.just(dtype_k), st.sampled_from(dtypes)))
    return Case(
        batch,
        kv_heads,
        n_rep,
        seq,
        dim_k,
        dim_v,
        dtype_k,
        dtype_v,
        draw(st.sampled_from(LAYOUTS)),
        draw(st.sampled_from(LAYOUTS)),
        draw(st.integers(0, 2**16)),
    )


def grad_cases() -> st.SearchStrategy[Case]:
    return cases(dtypes=GRAD_DTYPES)

"""Every case the benchmarks run, in one registry: a new case is one line here.

The named kernel shapes, the grid of users' shapes, the attention blocks, the end-to-end
models, the launch-settings sweep grids and the profiler's points. Not for: how they are
timed (:mod:`benchmarks.timing`) or judged (:mod:`benchmarks.targets`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor


@dataclass(frozen=True)
class Shape:
    """k and v of ``[B, H_kv, N, D]`` expanded to ``heads``; ``bnhd``: given as transposed
    ``[B, N, H, D]`` views."""

    name: str
    batch: int
    kv_heads: int
    heads: int
    seq: int
    dim: int
    bnhd: bool = False

    @property
    def n_rep(self) -> int:
        return self.heads // self.kv_heads

    def minimal_bytes(self, itemsize: int) -> int:
        """Both tensors: each input element read once, each output element written once."""
        return 2 * (1 + self.n_rep) * self.batch * self.kv_heads * self.seq * self.dim * itemsize

    def describe(self) -> str:
        view = ", BNHD view" if self.bnhd else ""
        return f"{self.batch}, {self.kv_heads}->{self.heads}, {self.seq}, {self.dim}{view}"

    def tensors(
        self, dtype: torch.dtype, device: str, heads: int | None = None, requires_grad: bool = False
    ) -> tuple[Tensor, Tensor]:
        """A fresh random pair of ``[B, heads, N, D]`` (``kv_heads`` unless given) in the case's layout."""
        h = self.kv_heads if heads is None else heads

        def one() -> Tensor:
            if self.bnhd:
                return torch.randn(self.batch, self.seq, h, self.dim, device=device, dtype=dtype).transpose(
                    1, 2
                )
            return torch.randn(self.batch, h, self.seq, self.dim, device=device, dtype=dtype)

        return one().requires_grad_(requires_grad), one().requires_grad_(requires_grad)

    def scaled(self, max_bytes: int, itemsize: int) -> Shape:
        """The same heads and head dim with the sequence (then the batch) halved until the job
        moves at most ``max_bytes``: how a CPU or a smoke test runs a GPU-sized case."""
        shape = self
        while shape.minimal_bytes(itemsize) > max_bytes and (shape.seq > 1 or shape.batch > 1):
            if shape.seq > 16 or shape.batch == 1:
                shape = replace(shape, seq=(shape.seq + 1) // 2)
            else:
                shape = replace(shape, batch=(shape.batch + 1) // 2)
        return shape


# The kernel benchmark's named shapes (B, H_kv -> H, N, D).
SHAPES = (
    Shape("llama3-8b", 4, 8, 32, 4096, 128),
    Shape("llama3-70b", 2, 8, 64, 8192, 128),
    Shape("qwen2-7b", 4, 4, 28, 4096, 128),
    Shape("mqa", 4, 1, 71, 2048, 64),
    Shape("gemma2", 2, 8, 16, 4096, 256),
    Shape("long-context", 1, 8, 32, 32768, 128),
    Shape("many-short", 64, 8, 32, 128, 128),
    Shape("small", 1, 8, 32, 512, 128),
    Shape("llama3-8b-bnhd", 4, 8, 32, 4096, 128, bnhd=True),
    Shape("phi3-medium", 2, 10, 40, 4096, 128),
    Shape("head-dim-64", 4, 8, 32, 4096, 64),
    Shape("head-dim-80", 4, 8, 32, 4096, 80),
    Shape("head-dim-96", 4, 8, 32, 4096, 96),
    Shape("decode-batch", 32, 8, 32, 2048, 128),
    Shape("qwen2-7b-bnhd", 4, 4, 28, 4096, 128, bnhd=True),
)
BY_NAME = {s.name: s for s in SHAPES}
# The host-bound shape: the host section and the compiled part's wall-clock table time it.
SMALL = BY_NAME["small"]
CPU_SHAPES = ("llama3-8b", "mqa", "small")  # what a CPU runs by default, scaled to CPU_MAX_MB
CPU_MAX_MB = 32.0
# The compiled part's GPU-time shapes (each costs several compilations): the commonest GQA
# shape, MQA and the widest head dim.
COMPILED_SHAPES = ("llama3-8b", "mqa", "gemma2")

# The users' grid: (config, KV heads, query heads, head dim) from models' configurations,
# crossed with sequence lengths that are not powers of two and batches.
CONFIGS = (
    ("llama3.2-1b", 8, 32, 64),
    ("head-dim-80", 6, 30, 80),
    ("phi3-small", 8, 32, 96),
    ("llama3-8b", 8, 32, 128),
    ("qwen2-7b", 4, 28, 128),
    ("qwen1.5-32b", 8, 40, 128),
    ("llama3-70b", 8, 64, 128),
    ("gemma2-9b", 8, 16, 256),
    ("falcon-7b-mqa", 1, 71, 64),
    ("mqa-32", 1, 32, 128),
    ("phi3-medium", 10, 40, 128),
    ("starcoder2-15b", 4, 48, 128),
    ("chatglm3-6b", 2, 32, 128),
    ("falcon-180b", 8, 232, 64),
)
SEQS = (1000, 1531, 3001, 4095)
BATCHES = (1, 2, 4, 8)
BNHD_CONFIGS = ("llama3-8b", "qwen2-7b")  # transposed projections: the layout, not the model, matters
USERS_FULL = {"configs": tuple(c[0] for c in CONFIGS), "seqs": SEQS, "batches": BATCHES}
# --quick: every kind of point (n_rep 4 to 29 and MQA, 2 to 10 KV heads, batch 1) at two sizes.
USERS_QUICK = {"configs": ("llama3-8b", "qwen2-7b", "falcon-7b-mqa", "phi3-medium", "starcoder2-15b", "chatglm3-6b",
                           "falcon-180b"), "seqs": (1000, 3001), "batches": (1, 4)}  # fmt: skip
# A CPU runs the reference on a tiny grid: the code paths, not the figures.
USERS_CPU = {"configs": ("llama3-8b", "mqa-32"), "seqs": (33, 65), "batches": (1, 2)}


def users_shapes(configs: tuple[str, ...], seqs: tuple[int, ...], batches: tuple[int, ...],
                 layouts: tuple[str, ...]) -> list[Shape]:  # fmt: skip
    """The grid's points, named by their configuration."""
    return [
        Shape(name, batch, kv, heads, seq, dim, bnhd=layout == "bnhd")
        for name, kv, heads, dim in CONFIGS
        if name in configs
        for seq in seqs
        for batch in batches
        for layout in layouts
        if layout == "bhnd" or name in BNHD_CONFIGS
    ]


# Attention blocks: GQA and MQA, host-bound (small) and GPU-bound, head dims 64 to 256.
ATTENTION = (
    Shape("gqa-small", 1, 8, 32, 256, 64),
    Shape("gqa", 8, 8, 32, 1024, 128),
    Shape("gqa-d256", 2, 8, 16, 1500, 256),
    Shape("mqa-small", 1, 1, 32, 256, 128),
    Shape("mqa", 8, 1, 32, 1024, 128),
    Shape("mqa-batch-1", 1, 1, 32, 4096, 128),
)
ATTENTION_CPU_MAX_MB = 0.25


@dataclass(frozen=True)
class Model:
    """A randomly initialised Llama and the padded batch it steps on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    batch: int
    seq: int
    dtype: str


MODELS = {
    # About 310M parameters; eager attention keeps [B, H, N, N] float32 softmax inputs, 12 GiB.
    "large": Model(4, 2048, 16, 4, 5632, 32000, 8, 2048, "bfloat16"),
    # Host-bound: a step's GPU work is shorter than its Python.
    "small": Model(2, 256, 8, 2, 512, 1000, 4, 128, "bfloat16"),
    "tiny": Model(2, 64, 4, 2, 128, 128, 2, 16, "float32"),  # a CPU's
}

# Launch-settings candidates (python -m benchmarks.bench --sweep): LaunchSettings fields.
SWEEPS: dict[str, tuple[str, dict[str, tuple[int, ...]]]] = {
    "forward": ("forward", {"TILE_BYTES": (4096, 8192), "BYTES_PER_WARP": (1024, 2048), "WAVES": (4, 16),
                            "REP_MAJOR_MAX_REPS": (0, 16, 32), "CACHE_HINTS": (0, 1)}),
    "backward": ("backward", {"TILE_BYTES": (4096, 8192), "BYTES_PER_WARP": (1024, 2048), "REDUCE_UNROLL": (8, 16),
                              "REDUCE_SHORT_GROUP_BYTES_PER_WARP": (256, 512), "CACHE_HINTS": (0, 1)}),
    # Long groups (MQA): how finely to split the sequence, how many warps share a tile.
    "long-groups": ("backward", {"LONG_GROUP_WAVES": (4, 8, 16, 32), "REDUCE_UNROLL": (8, 16),
                                 "LONG_GROUP_MIN_TILE_BYTES": (256, 512, 1024, 2048),
                                 "LONG_GROUP_BYTES_PER_WARP": (256, 1024)}),
}  # fmt: skip

# Points of python -m benchmarks.split_probe: long groups and batch 1 with few KV heads, where
# the users' grid put the reduction under a same-size copy (per call: 1.2-1.9 waves at batch 1),
# and short groups that reach it (many waves).
SPLIT_PROBE_POINTS = (
    Shape("falcon-7b-mqa-B4-N1000", 4, 1, 71, 1000, 64),
    Shape("falcon-7b-mqa-B1-N3001", 1, 1, 71, 3001, 64),
    Shape("falcon-7b-mqa-B4-N3001", 4, 1, 71, 3001, 64),
    Shape("falcon-180b-B1-N1000", 1, 8, 232, 1000, 64),
    Shape("falcon-180b-B1-N3001", 1, 8, 232, 3001, 64),
    Shape("chatglm3-6b-B1-N3001", 1, 2, 32, 3001, 128),
    Shape("starcoder2-15b-B4-N1000", 4, 4, 48, 1000, 128),
    Shape("llama3-8b-B1-N3001", 1, 8, 32, 3001, 128),
    Shape("qwen2-7b-B1-N3001", 1, 4, 28, 3001, 128),
    Shape("starcoder2-15b-B1-N2500", 1, 4, 48, 2500, 128),
    Shape("falcon-40b-B1-N2500", 1, 8, 128, 2500, 64),
    Shape("chatglm3-6b-B1-N6000", 1, 2, 32, 6000, 128),
    Shape("qwen2.5-3b-B1-N6000", 1, 2, 16, 6000, 128),
    Shape("llama3-70b-B4-N1000", 4, 8, 64, 1000, 128),
    Shape("llama3-8b-B8-N4095", 8, 8, 32, 4095, 128),
)

# Points for a profiler (python -m benchmarks.profile_points): the kind the users' grid put
# under a same-size copy (long groups, short sequences, batch 1 with few KV heads) and two
# that reach it.
PROFILE_POINTS = (
    ("backward", Shape("starcoder2-15b-B1-N2500", 1, 4, 48, 2500, 128)),
    ("backward", Shape("falcon-40b-B1-N2500", 1, 8, 128, 2500, 64)),
    ("backward", Shape("qwen2.5-3b-B1-N6000", 1, 2, 16, 6000, 128)),
    ("forward", Shape("falcon-180b-B4-N3001", 4, 8, 232, 3001, 64)),
    ("backward", Shape("llama3-70b-B2-N1000", 2, 8, 64, 1000, 128)),
    ("backward", Shape("llama3-70b-B4-N1000", 4, 8, 64, 1000, 128)),
    ("backward", Shape("falcon-B2-N1000", 2, 1, 71, 1000, 64)),
    ("backward", Shape("falcon-B4-N4095", 4, 1, 71, 4095, 64)),
    ("backward", Shape("llama3-8b-B8-N4095", 8, 8, 32, 4095, 128)),
    ("forward", Shape("llama3-8b-B8-N4095", 8, 8, 32, 4095, 128)),
)

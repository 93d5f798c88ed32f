"""Which implementation runs: ``NEURALOPS_GQA_BACKEND``, and the Triton kernels, imported on first use."""

from __future__ import annotations

import os
from types import ModuleType

from torch import Tensor

BACKEND_ENV = "NEURALOPS_GQA_BACKEND"
"""Environment variable read on every call: ``auto`` (default), ``triton`` or ``torch``.

``auto`` runs the Triton kernels on CUDA tensors and the PyTorch reference elsewhere;
``triton`` forces the kernels (on a CPU only with ``TRITON_INTERPRET=1``); ``torch`` forces
the reference. Case and surrounding blanks don't matter; any other value is a ``ValueError``
from every call, eager, traced or on meta tensors.
"""
BACKENDS = ("auto", "triton", "torch")


def backend() -> str:
    """The backend ``NEURALOPS_GQA_BACKEND`` asks for, normalised; a ``ValueError`` if unknown."""
    raw = os.environ.get(BACKEND_ENV)
    if raw is None:
        return "auto"
    name = raw.strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(BACKENDS)}, got {raw!r}")
    return name


def use_triton(x: Tensor) -> bool:
    """Whether a call on ``x``'s device runs the Triton kernels (reads the variable once)."""
    choice = backend()
    if choice == "auto":
        return x.is_cuda
    if choice == "torch":
        return False
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError(
            f"{BACKEND_ENV}=triton on a {x.device.type} tensor needs TRITON_INTERPRET=1 "
            "(the Triton interpreter) set before neuralops_gqa runs its first kernel"
        )
    return True


_kernels: ModuleType | None = None


def triton_kernels() -> ModuleType:
    """``csrc_free_ops.gqa_triton``, imported on first use: a CPU-only install needs no Triton."""
    global _kernels
    if _kernels is None:
        try:
            import triton  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "neuralops_gqa: the Triton kernels need Triton, which is not installed; install the "
                'triton extra (pip install ".[triton]" from a checkout, or pip install triton; CUDA builds '
                f"of PyTorch on Linux bring it), or set {BACKEND_ENV}=torch for the PyTorch reference"
            ) from None
        from csrc_free_ops import gqa_triton

        _kernels = gqa_triton
    return _kernels

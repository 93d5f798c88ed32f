"""Grouped-query attention's KV head expansion as a PyTorch operator.

Importing this package registers ``torch.ops.neuralops.gqa_expand`` and
``torch.ops.neuralops.gqa_reduce`` (its backward); nothing else needs to be called.
"""

import torch

from neuralops_gqa import ops
from neuralops_gqa.functional import gqa_expand, repeat_kv
from neuralops_gqa.ops import aten_decompositions

if torch.distributed.is_available():
    from neuralops_gqa import distributed

    distributed.register_on_import()

__version__ = "0.2.0"  # the one home of the version: pyproject.toml reads it from here

__all__ = ["__version__", "aten_decompositions", "gqa_expand", "ops", "repeat_kv"]

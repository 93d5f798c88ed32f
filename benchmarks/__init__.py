"""The benchmark, its report and the docs' generated figures: run from a checkout, not installed.

``python -m benchmarks.bench`` (the op against its peers), ``python -m benchmarks.users_shapes``
(the grid of users' shapes), ``python -m benchmarks.attention`` (the op inside attention
blocks, peers as users run them), ``python -m benchmarks.e2e_transformers`` (a training step
of a small Llama). Nothing in ``neuralops_gqa`` or ``csrc_free_ops`` imports this package.
"""

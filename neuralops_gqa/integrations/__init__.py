"""Integrations of the op into other libraries, one module per library.

Each module imports its library at the top, so import only the one you use:
``neuralops_gqa.integrations.transformers`` for Hugging Face transformers. This package
itself imports nothing, and ``import neuralops_gqa`` never imports it.
"""

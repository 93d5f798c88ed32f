"""Kernels for the GQA head expansion: Triton kernels with their launchers, and the PyTorch reference.

``reference`` needs only PyTorch. ``gqa_triton`` imports Triton, so import it only where
Triton is wanted. Nothing in this package registers operators.
"""

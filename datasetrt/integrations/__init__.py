"""Integrations with frameworks users train with: PyTorch (`integrations.torch`) and Ray Data
(`integrations.ray`, public as `datasetrt.ray`). Each imports its framework lazily; the core never
imports this package.

Boundary: the dataset's integration seam (`dataset/seam.py`) and public records; no internals below it.
"""

"""WHAT: generative models and guides, kernels, GP conditionals, priors.

Imports nothing else of the project (a test parses every import to keep it so).
Torch modules end in ``_torch``, JAX modules in ``_jax`` where a piece exists for both backends.
"""

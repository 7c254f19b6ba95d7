"""Numerical switches that must be set explicitly, never as a side effect of ``import ppl_cl``."""

from __future__ import annotations

__all__ = ["enable_x64", "x64_enabled"]


def enable_x64() -> None:
    """Turn on JAX float64 (GP regression learners call this in their constructors).

    JAX reads this flag when arrays are created, so call it before building any JAX array that
    must be float64. It is process-wide, as JAX makes it.
    """
    import jax

    jax.config.update("jax_enable_x64", True)


def x64_enabled() -> bool:
    import jax

    return bool(jax.config.read("jax_enable_x64"))

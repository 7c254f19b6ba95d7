"""Explicit seeds everywhere: same seed, same result."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from ppl_cl.errors import ConfigError

__all__ = ["seed_everything", "jax_key", "as_generator", "check_seed", "MAX_SEED"]

#: seeds are unsigned 32-bit integers (NumPy's legacy seed, JAX's PRNGKey)
MAX_SEED = 2**32 - 1


def check_seed(seed: Any, option: str = "--seed") -> int:
    """``seed`` as an int in ``0 .. 2**32 - 1``, else a :class:`ConfigError` naming
    ``option``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{option}: expected an int in 0..{MAX_SEED} (2**32 - 1), received "
                          f"{seed!r}")
    return int(seed)


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's legacy global generator, torch (all devices) and Pyro.

    Library code never relies on these globals (it takes ``seed=`` / ``rng_key=``); this only
    makes user scripts and tests that use global generators repeatable.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    try:
        import pyro

        pyro.set_rng_seed(seed)
    except ImportError:  # pragma: no cover
        pass


def jax_key(seed: int):
    """``jax.random.PRNGKey(seed)`` (imported lazily so torch-only code never loads JAX)."""
    import jax

    return jax.random.PRNGKey(seed)


def as_generator(seed: "int | np.random.Generator | None") -> np.random.Generator:
    """A NumPy ``Generator`` from an int seed (or the generator itself; ``None`` = fresh entropy).

    Raises:
        TypeError: for anything else (a float or a bool is a bug, not a seed).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return np.random.default_rng()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an int or a numpy.random.Generator, received "
                        f"{type(seed).__name__}")
    return np.random.default_rng(int(seed))

"""Deterministic test harness (docs/design.md, Validation).

* every test starts from seed 0 in Python, NumPy, torch and Pyro, with Pyro's param store empty;
* JAX runs in float64 for the whole session (tests of float32 paths pass float32 arrays
  explicitly; a subprocess test checks that learners switch float64 on by themselves);
* warnings are errors (pyproject ``filterwarnings``) unless a test expects them;
* ``PPL_CL_DATA`` defaults to ``../shared/data`` beside the repository when that exists;
* markers: ``slow`` (deselected by default), ``gpu`` (skipped without CUDA),
  ``data("name", ...)`` (skipped, naming the missing file, when a dataset is absent).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

if "PPL_CL_DATA" not in os.environ and SHARED_DATA.is_dir():
    os.environ["PPL_CL_DATA"] = str(SHARED_DATA)
os.environ.setdefault("PPL_CL_PROGRESS", "0")
os.environ.setdefault("MPLBACKEND", "Agg")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _seed_and_reset():
    import pyro

    from ppl_cl.seeding import seed_everything

    seed_everything(0)
    pyro.clear_param_store()
    yield
    pyro.clear_param_store()


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def pytest_collection_modifyitems(config, items):
    from ppl_cl.data.root import MissingDataError, locate

    has_cuda = _cuda_available()
    missing_cache: dict[str, str | None] = {}
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device (torch sees none)"))
        for mark in item.iter_markers(name="data"):
            for name in mark.args:
                if name not in missing_cache:
                    try:
                        locate(name)
                        missing_cache[name] = None
                    except MissingDataError as err:
                        missing_cache[name] = str(err)
                if missing_cache[name]:
                    item.add_marker(pytest.mark.skip(reason=missing_cache[name]))


@pytest.fixture
def tmp_data_root(tmp_path, monkeypatch):
    """An empty data root that is the only one searched (for fixture files in real formats)."""
    from ppl_cl.data import root

    monkeypatch.setenv("PPL_CL_DATA", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(root, "_EXPLICIT_DIR", None)
    return tmp_path


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op torch thread for a module of tiny problems: avoids OpenMP oversubscription
    slowdowns (20x measured on a loaded 2-core machine); the caller's setting is restored.
    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _mcmc_agreement(a, b):
    """z-scores of the differences between two samplers' posterior means and standard
    deviations, from draws ``a, b`` of shape ``(chains, draws, d)`` (numpy), with Monte Carlo
    standard errors from each sampler's effective sample size (numpyro's
    ``effective_sample_size``, which uses the chain structure):

    * mean: ``se = sd / sqrt(ESS(x))``;
    * sd (delta method): ``se = sqrt(Var[(x - m)^2] / ESS((x - m)^2)) / (2 sd)``.

    Returns ``(z_mean, z_sd)``, each ``(d,)``."""
    import numpy as np
    from numpyro.diagnostics import effective_sample_size

    def stats(x):
        x = np.asarray(x, dtype=np.float64)
        flat = x.reshape(-1, x.shape[-1])
        m, sd = flat.mean(0), flat.std(0)
        sq = (x - m) ** 2
        se_m = sd / np.sqrt(effective_sample_size(x))
        se_sd = np.sqrt(sq.reshape(-1, x.shape[-1]).var(0) / effective_sample_size(sq)) / (2 * sd)
        return m, sd, se_m, se_sd

    ma, sa, ema, esa = stats(a)
    mb, sb, emb, esb = stats(b)
    return (ma - mb) / np.sqrt(ema ** 2 + emb ** 2), (sa - sb) / np.sqrt(esa ** 2 + esb ** 2)


@pytest.fixture
def mcmc_agreement():
    """:func:`_mcmc_agreement`: posterior means and sds of two samplers as z-scores."""
    return _mcmc_agreement

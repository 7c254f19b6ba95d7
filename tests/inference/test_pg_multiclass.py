"""The multi-class PG Gibbs baselines of GP-Tree's Table 1 against NUTS (NumPyro) on the same
models: logistic-softmax (LSM, Galy-Fajou et al. 2020) and one-vs-each (OVE, Snell & Zemel
2021), 9 points, 3 classes. Posterior means and standard deviations of all 27 latent values
agree within 4 Monte Carlo standard errors (ESS-based, both samplers); a sampler with one
conditional broken fails the same comparison (power checks)."""

import numpy as np
import pytest
import torch

from inference.pg_multiclass import LSMGibbs, MulticlassProblem, OVEGibbs
from inference.polya_gamma import random_polyagamma
from models.gp_tree import NodeKernelParams, node_gram
from models.linalg_torch import jitter_cholesky

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D = torch.float64
N_PER, C = 3, 3


def _problem(seed=0) -> MulticlassProblem:
    """3 classes x 3 points around the directions 0, 2 pi / 3, 4 pi / 3 (the kernel sees unit
    inputs), RBF output scale 4, lengthscale 1, jitter 1e-3."""
    g = np.random.default_rng(seed)
    angles = np.repeat(np.arange(C) * 2 * np.pi / C, N_PER) + 0.6 * g.normal(size=C * N_PER)
    X = torch.as_tensor(np.c_[np.cos(angles), np.sin(angles)], dtype=D)
    y = torch.as_tensor(np.repeat(np.arange(C), N_PER))
    K = node_gram(NodeKernelParams(torch.tensor(4.0, dtype=D), torch.tensor(1.0, dtype=D), 1e-3), X)
    return MulticlassProblem(K, jitter_cholesky(K), torch.nn.functional.one_hot(y, C).to(D))


def _nuts(problem: MulticlassProblem, likelihood: str, num_samples=800, chains=2):
    """NUTS on ``f_k = L u_k``, ``u_k ~ N(0, I)`` (k = 1..C) with the LSM or OVE likelihood;
    returns ``f`` as ``(chains, draws, C n)``."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    L = jnp.asarray(problem.L.numpy())
    Y = jnp.asarray(problem.Y.numpy())
    n = Y.shape[0]

    def model():
        u = numpyro.sample("u", dist.Normal(0, 1).expand([C, n]).to_event(2))
        f = numpyro.deterministic("f", u @ L.T)                       # (C, n): rows L u_k
        if likelihood == "lsm":      # log sigma(f_y) - log sum_k sigma(f_k)
            ls = jax.nn.log_sigmoid(f)
            ll = (ls * Y.T).sum(0) - jax.scipy.special.logsumexp(ls, axis=0)
        else:                        # sum_{c != y} log sigma(f_y - f_c)
            fy = (f * Y.T).sum(0, keepdims=True)
            ll = (jax.nn.log_sigmoid(fy - f) * (1.0 - Y.T)).sum(0)
        numpyro.factor("y", ll.sum())

    mcmc = MCMC(NUTS(model), num_warmup=300, num_samples=num_samples, num_chains=chains,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(1))
    f = np.asarray(mcmc.get_samples(group_by_chain=True)["f"])
    return f.reshape(chains, num_samples, -1)


def _gibbs(engine, problem, sweeps=300, burn=60, seed=3):
    """``f`` of ``engine``'s chains after ``burn`` sweeps, ``(chains, sweeps - burn, C n)``."""
    state = engine.init(seed, problem)
    draws = []
    for s in range(sweeps):
        state, _ = engine.step(None, state, problem)
        if s >= burn:
            draws.append(state.f.reshape(state.f.shape[0], -1).numpy().copy())
    return np.stack(draws, 1)


@pytest.fixture(scope="module")
def problem():
    return _problem()


@pytest.fixture(scope="module")
def nuts_lsm(problem):
    return _nuts(problem, "lsm")


@pytest.fixture(scope="module")
def nuts_ove(problem):
    return _nuts(problem, "ove")


class _LSMPoissonSignSlip(LSMGibbs):
    """LSM with one conditional broken: ``n | lambda, f ~ Poisson(lambda sigma(f))`` instead of
    ``Poisson(lambda sigma(-f))`` (a sign slip in Galy-Fajou et al.'s eq. for the counts)."""

    def _augment(self, f, Y, g):
        from inference.polya_gamma import random_pg_counts

        sig = torch.sigmoid(f)
        u = torch.rand(f.shape[0], f.shape[-1], dtype=f.dtype, generator=g)
        lam = -torch.log(u.clamp_min(torch.finfo(f.dtype).tiny)) / sig.sum(-2)
        counts = torch.poisson(lam.unsqueeze(-2) * sig, generator=g)
        b = (Y.T.unsqueeze(0) + counts).round().to(torch.int64)
        return lam, counts, random_pg_counts(b, f, g)


class _OVEUntilted(OVEGibbs):
    """OVE with one conditional broken: ``omega | f ~ PG(1, psi / 2)`` instead of
    ``PG(1, psi)``."""

    def _omega(self, f, Y, g):
        return random_polyagamma(1, 0.5 * self._pairs(f, Y), g, validate=False) * (1.0 - Y)


def test_lsm_gibbs_matches_nuts(problem, nuts_lsm, mcmc_agreement):
    z_mean, z_sd = mcmc_agreement(_gibbs(LSMGibbs(num_chains=40), problem), nuts_lsm)
    assert np.abs(z_mean).max() < 4.0, z_mean
    assert np.abs(z_sd).max() < 4.0, z_sd


def test_lsm_comparison_catches_a_broken_conditional(problem, nuts_lsm, mcmc_agreement):
    z_mean, z_sd = mcmc_agreement(_gibbs(_LSMPoissonSignSlip(num_chains=40), problem), nuts_lsm)
    assert max(np.abs(z_mean).max(), np.abs(z_sd).max()) > 8.0


def test_ove_gibbs_matches_nuts(problem, nuts_ove, mcmc_agreement):
    z_mean, z_sd = mcmc_agreement(_gibbs(OVEGibbs(num_chains=40), problem), nuts_ove)
    assert np.abs(z_mean).max() < 4.0, z_mean
    assert np.abs(z_sd).max() < 4.0, z_sd


def test_ove_comparison_catches_a_broken_conditional(problem, nuts_ove, mcmc_agreement):
    z_mean, z_sd = mcmc_agreement(_gibbs(_OVEUntilted(num_chains=40), problem), nuts_ove)
    assert max(np.abs(z_mean).max(), np.abs(z_sd).max()) > 8.0


@pytest.mark.parametrize("cls", [LSMGibbs, OVEGibbs])
def test_run_equals_the_explicit_loop_bit_for_bit(cls, problem):
    """``run`` draws what ``init`` then ``step(None, ...)`` in a loop draws: the final state,
    the last Info and the kept ``f`` / ``log_likelihood`` of every sweep, bit for bit; a given
    ``state`` continues it, and 0 sweeps return the initial state."""
    engine = cls(num_chains=3)
    state = engine.init(11, problem)
    fs, lls = [], []
    for _ in range(4):
        state, info = engine.step(None, state, problem)
        fs.append(state.f)
        lls.append(info.log_likelihood)

    final, last, draws = engine.run(problem, 4, seed=11, keep=True)
    for a, b in zip(final, state):
        assert torch.equal(a, b)
    assert torch.equal(last.log_likelihood, info.log_likelihood)
    assert torch.equal(draws["f"], torch.stack(fs))
    assert torch.equal(draws["log_likelihood"], torch.stack(lls))

    half, _, none = engine.run(problem, 2, seed=11)
    assert none is None
    rest, _, _ = engine.run(problem, 2, state=half)
    for a, b in zip(rest, state):
        assert torch.equal(a, b)
    zero, info0, none = engine.run(problem, 0, seed=11, keep=True)
    assert none is None and not info0.log_likelihood.any()
    for a, b in zip(zero, engine.init(11, problem)):
        assert torch.equal(a, b)

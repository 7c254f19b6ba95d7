"""PG block Gibbs against NUTS (NumPyro) on the same Bernoulli-logit GP, and its mechanics."""

import math

import numpy as np
import pytest
import torch

from inference.pg_gibbs import GibbsState, PGGibbs, pad_problems, unpad
from models.gp_tree import NodeKernelParams, gibbs_predictive, node_gram, node_kernel
from models.linalg_torch import jitter_cholesky

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D = torch.float64


def _node(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, dtype=D, generator=g)
    y = (X[:, 0] + 0.3 * torch.randn(n, dtype=D, generator=g) > 0).long()
    params = NodeKernelParams(torch.tensor(4.0, dtype=D), torch.tensor(1.0, dtype=D), 1e-3)
    return X, y, params


def _nuts_reference(K: np.ndarray, K_xs: np.ndarray, y: np.ndarray, num_samples=1000, chains=2):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    L = jnp.asarray(np.linalg.cholesky(K))
    Kxs = jnp.asarray(K_xs)
    yj = jnp.asarray(y)

    def model():
        u = numpyro.sample("u", dist.Normal(0, 1).expand([K.shape[0]]).to_event(1))
        f = numpyro.deterministic("f", L @ u)
        # f* = K*^T K^-1 f: the posterior mean of f* given f (the latent at the test points)
        numpyro.deterministic("fs", Kxs.T @ jax.scipy.linalg.cho_solve((L, True), f))
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=yj)

    mcmc = MCMC(NUTS(model), num_warmup=300, num_samples=num_samples, num_chains=chains,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0))
    from numpyro.diagnostics import effective_sample_size
    s = mcmc.get_samples(group_by_chain=True)
    f = np.asarray(s["f"])
    fs = np.asarray(s["fs"])
    return (f.reshape(-1, f.shape[-1]), np.asarray(effective_sample_size(f)),
            fs.reshape(-1, fs.shape[-1]), np.asarray(effective_sample_size(fs)))


def test_gibbs_posterior_matches_nuts_within_monte_carlo_error():
    X, y, params = _node()
    Xs = torch.randn(4, 2, dtype=D, generator=torch.Generator().manual_seed(9))
    K = node_gram(params, X)
    k = node_kernel(params)
    K_xs = k(X, Xs)
    f_nuts, ess_nuts, fs_nuts, ess_fs = _nuts_reference(K.numpy(), K_xs.numpy(), y.numpy())

    engine = PGGibbs(num_chains=40)
    problem = pad_problems([K], [y.to(D) - 0.5])
    state = engine.init(1, problem)
    for _ in range(50):                                       # burn-in
        state, _ = engine.step(None, state, problem)
    _, _, draws = engine.run(problem, 150, state=state, keep=True)
    f = draws["f"][:, 0]                                      # (steps, chains, n)
    chain_means = f.mean(0)                                   # chains are independent
    g_mean = chain_means.mean(0).numpy()
    g_se = (chain_means.std(0) / math.sqrt(f.shape[1])).numpy()
    n_mean = f_nuts.mean(0)
    n_se = f_nuts.std(0) / np.sqrt(ess_nuts)
    z = (g_mean - n_mean) / np.sqrt(g_se ** 2 + n_se ** 2)
    assert np.abs(z).max() < 4.0, z
    # posterior standard deviations agree to the precision the draws allow (~10%)
    g_sd = f.reshape(-1, f.shape[-1]).std(0).numpy()
    np.testing.assert_allclose(g_sd, f_nuts.std(0), rtol=0.12)
    # the latent at test points: E[f* | y] from eq. 12 averaged over draws of omega equals
    # E[K*^T K^-1 f | y] under NUTS
    om = draws["omega"][:, 0].reshape(-1, X.shape[0])
    kappa = (y.to(D) - 0.5).expand_as(om)
    mean_s, _ = gibbs_predictive(K, om, kappa, K_xs, k.diag(Xs))
    per_chain = mean_s.reshape(150, 40, -1).mean(0)
    gm, gse = per_chain.mean(0).numpy(), (per_chain.std(0) / math.sqrt(40)).numpy()
    zs = (gm - fs_nuts.mean(0)) / np.sqrt(gse ** 2 + (fs_nuts.std(0) / np.sqrt(ess_fs)) ** 2)
    assert np.abs(zs).max() < 4.0, zs


def test_wrong_conditional_would_be_caught():
    """Power check: with kappa of the opposite sign the Gibbs mean moves far outside the
    tolerance used above."""
    X, y, params = _node()
    K = node_gram(params, X)
    engine = PGGibbs(num_chains=40)
    good = pad_problems([K], [y.to(D) - 0.5])
    bad = pad_problems([K], [0.5 - y.to(D)])
    _, _, dg = engine.run(good, 100, seed=0, keep=True)
    _, _, db = engine.run(bad, 100, seed=0, keep=True)
    diff = (dg["f"].mean((0, 2)) - db["f"].mean((0, 2))).abs()
    se = dg["f"].mean(0).std(1) / math.sqrt(40)
    assert float((diff[0] / se[0].clamp_min(1e-3)).max()) > 10


def test_padding_gives_each_node_its_own_chain_exactly():
    """Nodes sampled together in one padded batch follow the same law as alone: same seed,
    one node alone vs the same node padded beside another gives the same posterior means."""
    X1, y1, params = _node(n=10, seed=1)
    X2, y2, _ = _node(n=6, seed=2)
    L1, L2 = node_gram(params, X1), node_gram(params, X2)
    k1, k2 = y1.to(D) - 0.5, y2.to(D) - 0.5
    engine = PGGibbs(num_chains=200)
    both = pad_problems([L1, L2], [k1, k2])
    assert both.L.shape == (2, 10, 10) and int(both.mask[1].sum()) == 6
    _, _, d_both = engine.run(both, 60, seed=3, keep=True)
    _, _, d_two = engine.run(pad_problems([L2], [k2]), 60, seed=4, keep=True)
    f_pad = d_both["f"][20:, 1, :, :6]
    f_alone = d_two["f"][20:, 0]
    m_pad, m_alone = f_pad.mean((0, 1)), f_alone.mean((0, 1))
    se = torch.sqrt(f_pad.mean(0).var(0) / 200 + f_alone.mean(0).var(0) / 200)
    assert float(((m_pad - m_alone) / se).abs().max()) < 4.0
    assert unpad(d_both["f"][0], both, 1).shape == (200, 6)


def test_same_state_same_chain_and_state_is_arrays():
    X, y, params = _node()
    problem = pad_problems([node_gram(params, X)], [y.to(D) - 0.5])
    engine = PGGibbs(num_chains=5)
    s0 = engine.init(7, problem)
    assert isinstance(s0, GibbsState) and s0.rng_state.dtype == torch.uint8
    a, _ = engine.step(None, s0, problem)
    b, info = engine.step(None, s0, problem)
    assert torch.equal(a.f, b.f) and torch.equal(a.omega, b.omega) and int(a.step) == 1
    assert info.log_marginal.shape == (1, 5) and bool(torch.isfinite(info.log_marginal).all())


def test_reference_pg_scheme_samples_the_same_posterior():
    X, y, params = _node()
    problem = pad_problems([node_gram(params, X)], [y.to(D) - 0.5])
    ours = PGGibbs(num_chains=60).run(problem, 80, seed=0, keep=True)[2]["f"][20:, 0]
    ref = PGGibbs(num_chains=60, pg_sampler="polyagamma").run(problem, 80, seed=0, keep=True)[2]["f"][20:, 0]
    se = torch.sqrt(ours.mean(0).var(0) / 60 + ref.mean(0).var(0) / 60)
    assert float(((ours.mean((0, 1)) - ref.mean((0, 1))) / se).abs().max()) < 4.0


def test_bad_engine_arguments():
    with pytest.raises(ValueError, match="num_chains"):
        PGGibbs(num_chains=0)
    with pytest.raises(ValueError, match="pg_sampler"):
        PGGibbs(pg_sampler="cpu")


def test_engines_follow_the_engine_contract():
    from inference.base import Engine, is_state
    from inference.pg_multiclass import LSMGibbs, MulticlassProblem, OVEGibbs

    for engine in (PGGibbs(num_chains=2), LSMGibbs(num_chains=2), OVEGibbs(num_chains=2)):
        assert isinstance(engine, Engine)
    X, y, params = _node(n=6)
    K = node_gram(params, X)
    problem = pad_problems([K], [y.to(D) - 0.5])
    state = PGGibbs(num_chains=2).init(0, problem)
    assert is_state(state) and is_state(PGGibbs(num_chains=2).step(None, state, problem)[0])
    Y = torch.nn.functional.one_hot(y, 2).to(D)
    mp = MulticlassProblem(K, jitter_cholesky(K), Y)
    assert is_state(LSMGibbs(num_chains=2).init(0, mp))
    assert is_state(OVEGibbs(num_chains=2).init(0, mp))

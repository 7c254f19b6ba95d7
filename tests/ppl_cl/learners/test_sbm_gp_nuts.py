"""SBM-GP (GP-Tree's machinery on the stick-breaking chain; Linderman et al. 2015) against NUTS
(NumPyro) on the stick-breaking model written from its definition, 9 points, 3 classes:

    psi_j ~ GP(0, k) on all points (j = 0, 1),
    p(y = j | psi) = sigma(psi_j) prod_{k < j} (1 - sigma(psi_k))   (class 2: prod_{k < 2}).

The chain's node j separates class j (left) from the classes after it (right), so its latent
is ``f_j = -psi_j`` on the points of classes >= j, and the learner's class probabilities at test
points are eq. 9's products of its node predictives (eq. 12 by Gauss-Hermite). Both are compared
with NUTS within 4 Monte Carlo standard errors; a learner with the node labels flipped fails the
same comparison (power check)."""

import numpy as np
import pytest
import torch

from models.gp_tree import (NodeKernelParams, gibbs_predictive, node_gram, node_kernel,
                            sigmoid_expectation)
from ppl_cl import Batch
from ppl_cl.learners.gp_tree import SBMGP

pytestmark = pytest.mark.usefixtures("one_torch_thread")
D = torch.float64
N_PER, C, JITTER, SCALE = 3, 3, 1e-3, 4.0


def _data(seed=0):
    g = np.random.default_rng(seed)
    angles = np.repeat(np.arange(C) * 2 * np.pi / C, N_PER) + 0.6 * g.normal(size=C * N_PER)
    X = np.c_[np.cos(angles), np.sin(angles)]
    y = np.repeat(np.arange(C), N_PER).astype(np.int64)
    t = np.linspace(0.3, 2 * np.pi - 0.3, 5)
    return X, y, np.c_[np.cos(t), np.sin(t)]


def _params():
    return NodeKernelParams(torch.tensor(SCALE, dtype=D), torch.tensor(1.0, dtype=D), JITTER)


def _nuts(X, y, Xs, num_samples=800, chains=2):
    """``psi (chains, draws, C - 1, n)`` and the class probabilities at ``Xs`` per draw,
    ``(chains, draws, m, C)`` (``psi* | psi`` integrated by Gauss-Hermite, 20 nodes)."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    params = _params()
    K = node_gram(params, torch.as_tensor(X, dtype=D)).numpy()
    k = node_kernel(params)
    Ks = k(torch.as_tensor(X, dtype=D), torch.as_tensor(Xs, dtype=D)).numpy()
    kss = k.diag(torch.as_tensor(Xs, dtype=D)).numpy() + JITTER
    L = jnp.asarray(np.linalg.cholesky(K))
    n = y.size
    Y = jnp.asarray(np.eye(C)[y])                                     # (n, C)
    below = jnp.asarray((np.arange(C - 1)[:, None] < y[None, :]).astype(float))  # k < y_i

    def model():
        u = numpyro.sample("u", dist.Normal(0, 1).expand([C - 1, n]).to_event(2))
        psi = numpyro.deterministic("psi", u @ L.T)                   # (C - 1, n)
        ll = (below * jax.nn.log_sigmoid(-psi)).sum(0) \
            + (Y[:, :C - 1].T * jax.nn.log_sigmoid(psi)).sum(0)
        numpyro.factor("y", ll.sum())

    mcmc = MCMC(NUTS(model), num_warmup=300, num_samples=num_samples, num_chains=chains,
                chain_method="sequential", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2))
    psi = np.asarray(mcmc.get_samples(group_by_chain=True)["psi"])    # (ch, S, C - 1, n)
    # psi* | psi ~ N(Ks^T K^-1 psi, kss - diag(Ks^T K^-1 Ks)) per node (test-only dense solve)
    A = np.linalg.solve(K, Ks)                                        # (n, m)
    mean = psi @ A                                                    # (ch, S, C - 1, m)
    var = kss - (Ks * A).sum(0)
    s_right = sigmoid_expectation(torch.as_tensor(mean), torch.as_tensor(var).expand(mean.shape)
                                  ).numpy()                           # E sigma(psi*): class j
    p = np.empty(mean.shape[:2] + (Xs.shape[0], C))
    rest = np.ones(mean.shape[:2] + (Xs.shape[0],))
    for j in range(C - 1):
        p[..., j] = rest * s_right[:, :, j]
        rest = rest * (1.0 - s_right[:, :, j])
    p[..., C - 1] = rest
    return psi, p


@pytest.fixture(scope="module")
def reference():
    X, y, Xs = _data()
    return (X, y, Xs) + _nuts(X, y, Xs)


def _fit(X, y, chains=40, sweeps=300):
    sbm = SBMGP(num_chains=chains, num_steps=sweeps, gibbs_outputscale=SCALE, gibbs_jitter=JITTER)
    sbm.update(Batch(X, y))
    return sbm


def _latent(sbm, y, psi, burn=60):
    """Gibbs ``f_j`` and NUTS ``-psi_j`` on node j's points, both ``(chains, draws, sum n_j)``."""
    gibbs, nuts = [], []
    for j, i in enumerate(sbm.tree.internal_nodes()):          # chain order: node j = class j
        assert sbm.tree.nodes[i].classes == tuple(range(j, C))
        idx = np.flatnonzero(y >= j)
        gibbs.append(sbm.nodes[i]["f_trace"][burn:].permute(1, 0, 2).numpy())
        nuts.append(-psi[:, :, j, idx])
    return np.concatenate(gibbs, -1), np.concatenate(nuts, -1)


def _predictive_z(sbm, Xs, p_nuts):
    """z-scores of the learner's class probabilities at ``Xs`` against NUTS: the learner's are
    products (eq. 9) of node predictives averaged over the chains' last omega, so its standard
    error is the delta method over the per-chain node predictives (chains independent)."""
    from numpyro.diagnostics import effective_sample_size

    params = _params()
    k = node_kernel(params)
    Xs_t = torch.as_tensor(Xs, dtype=D)
    m, v = [], []                                                     # per node: P(right), var
    for i in sbm.tree.internal_nodes():
        node = sbm.nodes[i]
        K = node_gram(params, node["X"])
        mean, var = gibbs_predictive(K, node["omega"], node["kappa"].expand_as(node["omega"]),
                                     k(node["X"], Xs_t), k.diag(Xs_t) + JITTER)
        pc = sigmoid_expectation(mean, var).numpy()                   # (chains, m)
        m.append(pc.mean(0))
        v.append(pc.var(0, ddof=1) / pc.shape[0])
    (m0, m1), (v0, v1) = m, v
    ours = np.stack([1 - m0, m0 * (1 - m1), m0 * m1], -1)
    np.testing.assert_allclose(sbm.predict(Xs).probs, ours, atol=1e-10)   # eq. 9 as the learner does
    var_ours = np.stack([v0, (1 - m1) ** 2 * v0 + m0 ** 2 * v1, m1 ** 2 * v0 + m0 ** 2 * v1], -1)
    flat = p_nuts.reshape(p_nuts.shape[:2] + (-1,))
    se_nuts = flat.reshape(-1, flat.shape[-1]).std(0) / np.sqrt(effective_sample_size(flat))
    return (ours.reshape(-1) - flat.reshape(-1, flat.shape[-1]).mean(0)) / \
        np.sqrt(var_ours.reshape(-1) + se_nuts ** 2)


def test_sbm_gp_matches_nuts(reference, mcmc_agreement):
    X, y, Xs, psi, p_nuts = reference
    sbm = _fit(X, y)
    z_mean, z_sd = mcmc_agreement(*_latent(sbm, y, psi))
    assert np.abs(z_mean).max() < 4.0, z_mean
    assert np.abs(z_sd).max() < 4.0, z_sd
    z_pred = _predictive_z(sbm, Xs, p_nuts)
    assert np.abs(z_pred).max() < 4.0, z_pred


def test_sbm_gp_comparison_catches_flipped_node_labels(reference, mcmc_agreement, monkeypatch):
    from ppl_cl.trees import ClassTree

    X, y, Xs, psi, p_nuts = reference
    labels = ClassTree.node_labels
    monkeypatch.setattr(ClassTree, "node_labels", lambda self, i, yy: 1 - labels(self, i, yy))
    sbm = _fit(X, y, sweeps=150)
    z_mean, _ = mcmc_agreement(*_latent(sbm, y, psi))
    assert np.abs(z_mean).max() > 8.0
    assert np.abs(_predictive_z(sbm, Xs, p_nuts)).max() > 8.0

"""LazyTraceMeanField_ELBO against its reference, Pyro's TraceMeanField_ELBO: the same loss and
the same gradients on the VAR-GP program (three tasks, every guide structure and both
hyperparameter modes) and on a generic model with a latent site that has no analytic KL; the
``shared_factor`` flag is checked when validation is on."""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import TraceMeanField_ELBO

from inference.elbo import LazyTraceMeanField_ELBO
from models.vargp import (HyperPosterior, InducingSet, PointHyperparameters, SoftmaxLikelihood,
                          VARGPModel)

DT = torch.float64
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _set(K, M, D, gen, shift=0.0):
    Z = torch.randn(K, M, D, generator=gen, dtype=DT) + shift
    m = torch.randn(K, M, generator=gen, dtype=DT)
    L = torch.tril(0.3 * torch.randn(K, M, M, generator=gen, dtype=DT), -1) + \
        torch.diag_embed(0.5 + torch.rand(K, M, generator=gen, dtype=DT))
    return InducingSet(Z, m, L)


def _vargp(guide, hyperparameters, gen, K=3, D=2, tasks=3):
    past = [_set(K, 3, D, gen, shift=0.3 * i) for i in range(tasks - 1)]
    cur = _set(K, 4, D, gen, shift=1.0)
    theta = 0.2 * torch.randn(1, D + 1, generator=gen, dtype=DT)
    hyper = PointHyperparameters(theta) if hyperparameters == "point" else \
        HyperPosterior(theta, 0.1 + 0 * theta)
    return VARGPModel(num_classes=K, past=past, init=cur, hyper_init=hyper, hyper_prior=hyper
                      if hyperparameters != "point" else None, guide=guide,
                      num_theta_samples=2, likelihood=SoftmaxLikelihood(3), jitter=1e-6)


def _loss_and_grads(elbo, model, guide, *args, seed=0, **kwargs):
    pyro.clear_param_store()
    torch.manual_seed(seed)
    with pyro.validation_enabled(False):
        loss = elbo.differentiable_loss(model, guide, *args, **kwargs)
    params = dict(pyro.get_param_store().named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return loss.detach(), {n: g for n, g in zip(params, grads)}


@pytest.mark.parametrize("guide, hyperparameters", [("autoregressive", "variational"),
                                                    ("block_diagonal", "variational"),
                                                    ("global", "variational"),
                                                    ("autoregressive", "point")])
def test_lazy_elbo_equals_pyro_trace_mean_field_on_vargp(guide, hyperparameters):
    gen = torch.Generator().manual_seed(1)
    m = _vargp(guide, hyperparameters, gen, tasks=2 if guide == "global" else 3)
    x = torch.randn(7, 2, generator=gen, dtype=DT)
    y = torch.randint(0, 3, (7,), generator=gen)
    ref, g_ref = _loss_and_grads(TraceMeanField_ELBO(max_plate_nesting=3), m.model, m.guide,
                                 x, y, num_data=50)
    lazy, g_lazy = _loss_and_grads(LazyTraceMeanField_ELBO(max_plate_nesting=3), m.model,
                                   m.guide, x, y, num_data=50)
    torch.testing.assert_close(lazy, ref, rtol=1e-10, atol=1e-10)
    assert g_lazy.keys() == g_ref.keys()
    for name in g_ref:
        if g_ref[name] is None:
            assert g_lazy[name] is None or not g_lazy[name].any()
        else:
            torch.testing.assert_close(g_lazy[name], g_ref[name], rtol=1e-8, atol=1e-10)


def test_lazy_elbo_skips_the_kl_of_shared_factors():
    """The frozen factors u_1 .. u_{t-1} are flagged in the guide and the model reuses the
    guide's objects; only u_t's KL and theta's KL are computed."""
    gen = torch.Generator().manual_seed(2)
    m = _vargp("autoregressive", "variational", gen, tasks=4)
    x = torch.randn(5, 2, generator=gen, dtype=DT)
    y = torch.randint(0, 3, (5,), generator=gen)
    calls = []
    real = torch.distributions.kl.kl_divergence

    def counting(p, q):
        calls.append((type(p).__name__, tuple(p.batch_shape)))
        return real(p, q)

    import inference.elbo as lazy_mod
    lazy_mod.kl_divergence, saved = counting, lazy_mod.kl_divergence
    try:
        pyro.clear_param_store()
        with pyro.validation_enabled(False):
            LazyTraceMeanField_ELBO(max_plate_nesting=3).differentiable_loss(
                m.model, m.guide, x, y, num_data=20)
    finally:
        lazy_mod.kl_divergence = saved
    assert len(calls) == 2   # theta and u_4; u_1, u_2, u_3 are shared factors


def test_generic_model_with_a_sampled_kl_and_an_observation():
    """A site with no registered KL (LogNormal guide, Gamma prior) takes the sampled
    log p - log q path, as in Pyro's class."""
    y = torch.tensor([0.3, 1.2, 0.7], dtype=DT)

    def model(y):
        s = pyro.sample("s", dist.Gamma(torch.tensor(2.0, dtype=DT), 1.0))
        w = pyro.sample("w", dist.Normal(torch.zeros(2, dtype=DT), 1.0).to_event(1))
        with pyro.plate("data", 3):
            pyro.sample("y", dist.Normal(w.sum(-1), s), obs=y)

    def guide(y):
        a = pyro.param("a", torch.tensor(0.1, dtype=DT))
        loc = pyro.param("loc", torch.tensor([0.2, -0.1], dtype=DT))
        pyro.sample("s", dist.LogNormal(a, 0.3))
        pyro.sample("w", dist.Normal(loc, 0.5).to_event(1))

    ref, g_ref = _loss_and_grads(TraceMeanField_ELBO(), model, guide, y, seed=3)
    lazy, g_lazy = _loss_and_grads(LazyTraceMeanField_ELBO(), model, guide, y, seed=3)
    torch.testing.assert_close(lazy, ref, rtol=1e-12, atol=1e-12)
    for name in g_ref:
        torch.testing.assert_close(g_lazy[name], g_ref[name], rtol=1e-10, atol=1e-12)


def test_a_wrongly_flagged_shared_factor_is_caught_under_validation():
    def model():
        pyro.sample("z", dist.Normal(torch.tensor(0.0, dtype=DT), 1.0))

    def guide():
        loc = pyro.param("loc", torch.tensor(0.5, dtype=DT))
        pyro.sample("z", dist.Normal(loc, 1.0), infer={"shared_factor": True})

    pyro.clear_param_store()
    with pyro.validation_enabled(True), pytest.raises(ValueError, match="shared_factor"):
        LazyTraceMeanField_ELBO().differentiable_loss(model, guide)
    with pyro.validation_enabled(False):   # not checked: the flag is trusted after step 1
        assert float(LazyTraceMeanField_ELBO().differentiable_loss(model, guide)) == 0.0

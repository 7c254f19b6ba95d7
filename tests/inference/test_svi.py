"""The SVI engine and the Yogi optimizer, against independent references: optax's Yogi, the
closed-form posterior of a conjugate Gaussian model, and exact minibatch algebra."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions import constraints

from inference.base import Engine, is_state
from inference.loop import LoopConfig, run_loop
from inference.svi import SVI, NonFiniteLossError
from inference.yogi import YogiConfig, yogi_init, yogi_update

DT = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------------
# Yogi == optax.yogi
# ---------------------------------------------------------------------------------------------
def test_yogi_matches_optax_iterates():
    import jax.numpy as jnp
    import optax

    rng = np.random.default_rng(0)
    A = rng.normal(size=(5, 5))
    Q = A @ A.T + np.eye(5)
    b = rng.normal(size=5)
    x0 = rng.normal(size=5)
    noise = rng.normal(size=(60, 5))  # a fixed "stochastic" gradient perturbation per step
    lr = 0.05

    def grad_np(x, k):
        return Q @ x - b + noise[k] * (1.0 + np.abs(x))

    opt = optax.yogi(lr)
    xj = jnp.asarray(x0)
    state = opt.init(xj)
    xs_optax = []
    for k in range(60):
        g = jnp.asarray(grad_np(np.asarray(xj), k))
        upd, state = opt.update(g, state, xj)
        xj = optax.apply_updates(xj, upd)
        xs_optax.append(np.asarray(xj))
    cfg = YogiConfig(learning_rate=lr)
    params = {"x": torch.tensor(x0, dtype=DT)}
    moments = yogi_init(params, cfg)
    xs_ours = []
    for k in range(60):
        grads = {"x": torch.as_tensor(grad_np(params["x"].numpy(), k))}
        params, moments = yogi_update(params, grads, moments, cfg)
        xs_ours.append(params["x"].numpy().copy())
    np.testing.assert_allclose(np.array(xs_ours), np.array(xs_optax), rtol=1e-10, atol=1e-12)
    assert moments.count == 60 and is_state(moments)


def test_yogi_rejects_bad_settings_and_leaves_its_inputs_alone():
    for kw in (dict(learning_rate=0.0), dict(b1=1.0), dict(eps=-1.0),
               dict(initial_accumulator=0)):
        with pytest.raises(ValueError):
            YogiConfig(**kw).check()
    p = {"x": torch.ones(2, dtype=DT)}
    m = yogi_init(p)
    new, _ = yogi_update(p, {"x": torch.ones(2, dtype=DT)}, m)
    assert torch.equal(p["x"], torch.ones(2, dtype=DT)) and not torch.equal(new["x"], p["x"])


# ---------------------------------------------------------------------------------------------
# a conjugate model: mu ~ N(0, tau^2), y_i ~ N(mu, s^2)
# ---------------------------------------------------------------------------------------------
TAU, SIGMA = 2.0, 1.0


def normal_model(y, num_data=None):
    mu = pyro.sample("mu", dist.Normal(torch.zeros((), dtype=y.dtype, device=y.device), TAU))
    with pyro.plate("data", num_data or len(y), subsample=torch.arange(len(y), device=y.device)):
        pyro.sample("y", dist.Normal(mu, SIGMA), obs=y)


def normal_guide(y, num_data=None):
    loc = pyro.param("loc", torch.zeros((), dtype=y.dtype, device=y.device))
    scale = pyro.param("scale", torch.ones((), dtype=y.dtype, device=y.device),
                       constraint=constraints.positive)
    pyro.sample("mu", dist.Normal(loc, scale))


def _posterior(y):
    prec = 1 / TAU ** 2 + len(y) / SIGMA ** 2
    return float(y.sum() / SIGMA ** 2 / prec), math.sqrt(1 / prec)


def fit(y, *, lr=0.05, batch_size=16, max_epochs=5, seed=0, model=normal_model,
        guide=normal_guide, **svi_kw):
    engine = SVI(model, guide, YogiConfig(learning_rate=lr), model_kwargs={"num_data": len(y)},
                 device=y.device, **svi_kw)
    state = engine.init(seed, y[:batch_size])
    res = run_loop(engine, state, (y,), LoopConfig(batch_size=batch_size,
                                                   max_epochs=max_epochs, seed=seed))
    return engine, res


def test_engine_follows_the_contract():
    y = torch.randn(20, dtype=DT)
    engine = SVI(normal_model, normal_guide, model_kwargs={"num_data": 20})
    state = engine.init(0, y)
    assert isinstance(engine, Engine) and is_state(state)
    new, info = engine.step(None, state, (y,))
    assert new.step == 1 and math.isfinite(info.loss) and info.grad_norm > 0
    # values, not objects: the old state is untouched by the step
    assert not torch.equal(new.params["loc"], state.params["loc"])
    assert torch.equal(state.params["loc"], engine.init(0, y).params["loc"])
    # the same state and batch give the same step (the generator is in the state)
    again, info2 = engine.step(None, state, (y,))
    assert info2.loss == info.loss and torch.equal(again.params["loc"], new.params["loc"])


def test_recovers_the_conjugate_posterior_with_minibatches():
    g = torch.Generator().manual_seed(0)
    y = 0.7 + SIGMA * torch.randn(200, generator=g, dtype=DT)
    lr = 0.05
    engine, res = fit(y, lr=lr, batch_size=50, max_epochs=200, seed=3, num_particles=16,
                      vectorize_particles=True, max_plate_nesting=1)
    params = engine.constrained(res.state, y)
    mean, sd = _posterior(y)
    # Yogi moves each unconstrained coordinate by at most ~lr per step, so at stationarity the
    # iterate fluctuates within a few lr around the optimum (the exact posterior here); the
    # scale is unconstrained through log (constraints.positive)
    assert abs(float(params["loc"]) - mean) < 3 * lr
    assert abs(math.log(float(params["scale"])) - math.log(sd)) < 3 * lr
    assert res.steps == 200 * 4 and res.epochs == 200 and not res.stopped_early
    assert len(res.epoch_losses) == 200 and res.validation == []


def test_minibatch_scaling_is_unbiased_n_over_b():
    """loss(batch) = KL + (N/B) sum_batch nll_i, so the mean over a partition = full loss."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(60, generator=g, dtype=DT)
    y = 2 * x + 0.3 * torch.randn(60, generator=g, dtype=DT)

    def model(x, y, num_data=None):
        w = pyro.param("w", torch.tensor(0.5, dtype=DT))
        pyro.sample("z", dist.Normal(torch.zeros((), dtype=DT), 1.0))
        with pyro.plate("data", num_data or len(x), subsample=torch.arange(len(x))):
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)

    def guide(x, y, num_data=None):
        pyro.sample("z", dist.Normal(pyro.param("zl", torch.tensor(0.3, dtype=DT)), 0.5))

    svi = SVI(model, guide, model_kwargs={"num_data": 60})
    state = svi.init(0, x, y)
    kl = float(torch.distributions.kl_divergence(dist.Normal(torch.tensor(0.3, dtype=DT), 0.5),
                                                 dist.Normal(torch.tensor(0.0, dtype=DT), 1.0)))
    nll = -dist.Normal(0.5 * x, 1.0).log_prob(y)

    def loss(*batch):
        with svi._store(state.params):
            return float(svi._loss(batch).detach())

    full = loss(x, y)
    assert math.isclose(full, kl + float(nll.sum()), rel_tol=1e-12)
    losses = []
    for idx in torch.randperm(60, generator=torch.Generator().manual_seed(0)).split(15):
        lb = loss(x[idx], y[idx])
        assert math.isclose(lb, kl + 60 / 15 * float(nll[idx].sum()), rel_tol=1e-12)
        losses.append(lb)
    assert math.isclose(np.mean(losses), full, rel_tol=1e-12)


# ---------------------------------------------------------------------------------------------
# guards, determinism
# ---------------------------------------------------------------------------------------------
def test_non_finite_loss_stops_with_a_clear_error_naming_the_step():
    calls = {"n": 0}

    def model(y, num_data=None):
        calls["n"] += 1
        w = pyro.param("w", torch.tensor(1.0, dtype=DT))
        bad = calls["n"] > 5  # the 6th evaluation (init + 4 steps, then the 5th step) is NaN
        pyro.factor("f", -(w - 2) ** 2 + (torch.tensor(float("nan")) if bad else 0.0))

    pyro.param("outer", torch.tensor(3.0))  # the caller's param store must survive
    y = torch.zeros(8, dtype=DT)
    with pytest.raises(NonFiniteLossError, match=r"loss \(negative ELBO\) became nan at "
                                                 r"optimizer step 5"):
        fit(y, batch_size=2, max_epochs=3, model=model, guide=lambda y, num_data=None: None)
    assert set(pyro.get_param_store().keys()) == {"outer"}


def test_non_finite_gradient_is_caught_before_the_step():
    def model(y, num_data=None):
        w = pyro.param("w", torch.tensor(0.0, dtype=DT))
        pyro.factor("f", -torch.sqrt(w.abs()))  # finite value, infinite gradient at 0

    with pytest.raises(NonFiniteLossError, match=r"gradient .* \['w'\]"):
        fit(torch.zeros(4), batch_size=4, max_epochs=1, model=model,
            guide=lambda y, num_data=None: None)


def test_same_seed_same_result_and_caller_rng_untouched():
    y = 0.5 + torch.randn(40, generator=torch.Generator().manual_seed(2), dtype=DT)
    torch.manual_seed(123)
    ea, a = fit(y, seed=11)
    after_a = torch.rand(3)
    torch.manual_seed(123)
    eb, b = fit(y, seed=11)
    torch.manual_seed(123)
    expected = torch.rand(3)
    assert torch.equal(after_a, expected)  # the fit left the global RNG alone
    pa, pb = ea.constrained(a.state, y), eb.constrained(b.state, y)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert a.epoch_losses == b.epoch_losses
    ec, c = fit(y, seed=12)
    assert not torch.equal(pa["loc"], ec.constrained(c.state, y)["loc"])


def test_init_needs_parameters_and_checks_settings():
    y = torch.randn(20, dtype=DT)
    with pytest.raises(ValueError, match="no pyro.param"):
        SVI(normal_model, lambda y, num_data=None: pyro.sample(
            "mu", dist.Normal(0.0, 1.0))).init(0, y)
    with pytest.raises(ValueError, match="validate_args"):
        SVI(normal_model, normal_guide, validate_args="sometimes")
    with pytest.raises(ValueError, match="num_particles"):
        SVI(normal_model, normal_guide, num_particles=0)


@pytest.mark.parametrize("mode, expected", [("first", [True, True, False, False]),
                                            ("always", [True] * 4), ("never", [False] * 4)])
def test_distribution_checks_run_on_the_first_step_only_by_default(mode, expected):
    """SVI(validate_args=...): Pyro's argument/support checks (one device read-back each) on
    the initializing evaluation and the first step ("first"), on every step, or never."""
    seen = []

    def model(y, num_data=None):
        seen.append(torch.distributions.Distribution._validate_args)
        w = pyro.param("w", torch.tensor(0.5, dtype=DT))
        with pyro.plate("data", num_data or len(y), subsample=torch.arange(len(y))):
            pyro.sample("y", dist.Normal(w, 1.0), obs=y)

    fit(torch.zeros(4), batch_size=4, max_epochs=3, model=model,
        guide=lambda y, num_data=None: None, validate_args=mode)
    assert seen == expected


@pytest.mark.gpu
def test_runs_on_cuda_and_resumes_bitwise(tmp_path):
    """The state carries the CUDA generator's state: the guide draws on the GPU, so a resumed
    loop repeats the uninterrupted one bitwise only if that state is restored."""
    from inference.loop import state_from_tree, state_to_tree
    from ppl_cl.persist import load_tree, save_tree

    y = (0.5 + torch.randn(60, generator=torch.Generator().manual_seed(4), dtype=DT)).cuda()
    engine = SVI(normal_model, normal_guide, model_kwargs={"num_data": 60}, num_particles=3,
                 device=y.device)
    state = engine.init(7, y[:16])
    cfg = LoopConfig(batch_size=16, max_epochs=6, seed=7)
    snaps = []
    full = run_loop(engine, state, (y,), cfg, snapshot=snaps.append, snapshot_every_s=0.0)
    assert engine.constrained(full.state, y[:16])["loc"].device.type == "cuda"
    save_tree(tmp_path / "s.npz", state_to_tree(snaps[2]))
    tree, _ = load_tree(tmp_path / "s.npz")
    res = run_loop(engine, state, (y,), cfg, resume=state_from_tree(tree, state))
    assert res.epoch_losses == full.epoch_losses and res.steps == full.steps
    assert torch.equal(res.state.params["loc"], full.state.params["loc"])

"""The continual SVI engine and the Yogi optimizer, against independent references: optax's
Yogi, the closed-form posterior of a conjugate Gaussian model, and exact minibatch algebra."""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.distributions import constraints

from inference.svi import (ContinualSVI, NonFiniteLossError, SVIConfig, minibatch_indices,
                           plateau_reached)
from inference.yogi import Yogi

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

    # optax
    opt = optax.yogi(lr)
    xj = jnp.asarray(x0)
    state = opt.init(xj)
    xs_optax = []
    for k in range(60):
        g = jnp.asarray(grad_np(np.asarray(xj), k))
        upd, state = opt.update(g, state, xj)
        xj = optax.apply_updates(xj, upd)
        xs_optax.append(np.asarray(xj))
    # ours
    xt = torch.tensor(x0, dtype=DT, requires_grad=True)
    ours = Yogi([xt], lr=lr)
    xs_ours = []
    for k in range(60):
        xt.grad = torch.as_tensor(grad_np(xt.detach().numpy(), k))
        ours.step()
        xs_ours.append(xt.detach().numpy().copy())
    np.testing.assert_allclose(np.array(xs_ours), np.array(xs_optax), rtol=1e-10, atol=1e-12)


def test_yogi_rejects_bad_settings():
    p = [torch.zeros(2, requires_grad=True)]
    for kw in (dict(lr=0.0), dict(betas=(1.0, 0.9)), dict(eps=-1.0), dict(initial_accumulator=0)):
        with pytest.raises(ValueError):
            Yogi(p, **kw)


# ---------------------------------------------------------------------------------------------
# a conjugate model: mu ~ N(0, tau^2), y_i ~ N(mu, s^2)
# ---------------------------------------------------------------------------------------------
TAU, SIGMA = 2.0, 1.0


def normal_model(y, num_data=None):
    mu = pyro.sample("mu", dist.Normal(torch.zeros((), dtype=y.dtype, device=y.device), TAU))
    with pyro.plate("data", num_data or len(y), subsample=torch.arange(len(y))):
        pyro.sample("y", dist.Normal(mu, SIGMA), obs=y)


def normal_guide(y, num_data=None):
    loc = pyro.param("loc", torch.zeros((), dtype=y.dtype, device=y.device))
    scale = pyro.param("scale", torch.ones((), dtype=y.dtype, device=y.device),
                       constraint=constraints.positive)
    pyro.sample("mu", dist.Normal(loc, scale))


def _posterior(y):
    prec = 1 / TAU ** 2 + len(y) / SIGMA ** 2
    return float(y.sum() / SIGMA ** 2 / prec), math.sqrt(1 / prec)


def test_recovers_the_conjugate_posterior_with_minibatches():
    g = torch.Generator().manual_seed(0)
    y = 0.7 + SIGMA * torch.randn(200, generator=g, dtype=DT)
    lr = 0.05
    cfg = SVIConfig(learning_rate=lr, batch_size=50, max_epochs=200, num_particles=16,
                    vectorize_particles=True, max_plate_nesting=1, seed=3)
    res = ContinualSVI(normal_model, normal_guide, cfg).fit((y,))
    mean, sd = _posterior(y)
    # Yogi moves each unconstrained coordinate by at most ~lr per step, so at stationarity the
    # iterate fluctuates within a few lr around the optimum (the exact posterior here); the
    # scale is unconstrained through log (constraints.positive)
    assert abs(float(res.params["loc"]) - mean) < 3 * lr
    assert abs(math.log(float(res.params["scale"])) - math.log(sd)) < 3 * lr
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

    svi = ContinualSVI(model, guide, SVIConfig(batch_size=15))
    kl = float(torch.distributions.kl_divergence(dist.Normal(torch.tensor(0.3, dtype=DT), 0.5),
                                                 dist.Normal(torch.tensor(0.0, dtype=DT), 1.0)))
    nll = -dist.Normal(0.5 * x, 1.0).log_prob(y)
    full = float(svi._loss(x, y, num_data=60).detach())
    assert math.isclose(full, kl + float(nll.sum()), rel_tol=1e-12)
    batches = minibatch_indices(60, 15, torch.Generator().manual_seed(0))
    assert sorted(torch.cat(batches).tolist()) == list(range(60))
    losses = []
    for idx in batches:
        lb = float(svi._loss(x[idx], y[idx], num_data=60).detach())
        assert math.isclose(lb, kl + 60 / 15 * float(nll[idx].sum()), rel_tol=1e-12)
        losses.append(lb)
    assert math.isclose(np.mean(losses), full, rel_tol=1e-12)


# ---------------------------------------------------------------------------------------------
# guards, determinism, early stopping
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
    with pytest.raises(NonFiniteLossError, match=r"epoch 2, minibatch 1 \(optimizer step 5\)"):
        ContinualSVI(model, lambda y, num_data=None: None,
                     SVIConfig(batch_size=2, max_epochs=3)).fit((y,))
    assert set(pyro.get_param_store().keys()) == {"outer"}


def test_non_finite_gradient_is_caught_before_the_step():
    def model(y, num_data=None):
        w = pyro.param("w", torch.tensor(0.0, dtype=DT))
        pyro.factor("f", -torch.sqrt(w.abs()))  # finite value, infinite gradient at 0

    with pytest.raises(NonFiniteLossError, match=r"gradient .* \['w'\]"):
        ContinualSVI(model, lambda y, num_data=None: None,
                     SVIConfig(batch_size=4, max_epochs=1)).fit((torch.zeros(4),))


def test_same_seed_same_result_and_caller_rng_untouched():
    y = 0.5 + torch.randn(40, generator=torch.Generator().manual_seed(2), dtype=DT)
    cfg = SVIConfig(learning_rate=0.05, batch_size=16, max_epochs=5, seed=11)

    torch.manual_seed(123)
    a = ContinualSVI(normal_model, normal_guide, cfg).fit((y,))
    after_a = torch.rand(3)
    torch.manual_seed(123)
    b = ContinualSVI(normal_model, normal_guide, cfg).fit((y,))
    torch.manual_seed(123)
    expected = torch.rand(3)
    assert torch.equal(after_a, expected)  # the fit forked the global RNG
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    assert a.epoch_losses == b.epoch_losses
    c = ContinualSVI(normal_model, normal_guide,
                     SVIConfig(learning_rate=0.05, batch_size=16, max_epochs=5, seed=12)).fit((y,))
    assert not torch.equal(a.params["loc"], c.params["loc"])


def test_plateau_rule_of_algorithm_1():
    assert not plateau_reached([0.5, 0.6], 2, 1e-4)
    assert not plateau_reached([0.5, 0.6, 0.7], 2, 1e-4)
    assert plateau_reached([0.5, 0.6, 0.7, 0.7, 0.7], 2, 1e-4)
    assert plateau_reached([0.5, 0.7, 0.6, 0.7], 2, 1e-4)  # A_4 == A_2: the paper stops
    assert not plateau_reached([0.5, 0.7, 0.6, 0.8], 2, 1e-4)
    assert plateau_reached([0.7, 0.5, 0.70005], 1, 1e-4) is False
    assert plateau_reached([0.7, 0.5, 0.70005], 2, 1e-4)


def test_early_stopping_restores_the_best_parameters():
    y = 0.5 + torch.randn(40, generator=torch.Generator().manual_seed(3), dtype=DT)
    scripted = iter([0.5, 0.6, 0.7, 0.7, 0.7, 0.9, 0.9])
    seen = []

    def validate():
        seen.append(float(pyro.param("loc").detach()))
        return next(scripted)

    cfg = SVIConfig(learning_rate=0.05, batch_size=10, max_epochs=20, patience=2,
                    tolerance=1e-4, seed=0)
    res = ContinualSVI(normal_model, normal_guide, cfg).fit((y,), validate=validate)
    # |A_5 - A_3| = 0 < tol after epoch 5 > patience: stop; best = epoch 3 (first 0.7)
    assert res.epochs == 5 and res.stopped_early
    assert res.best_epoch == 3 and res.best_validation == 0.7
    assert [v for _, v in res.validation] == [0.5, 0.6, 0.7, 0.7, 0.7]
    assert float(res.params["loc"]) == seen[2] and seen[2] != seen[4]

    no_restore = ContinualSVI(normal_model, normal_guide,
                              SVIConfig(**{**cfg.__dict__, "restore_best": False})).fit(
        (y,), validate=iter([0.5, 0.7, 0.6, 0.6, 0.6]).__next__)
    # best 0.7 at epoch 2, but the last epoch's parameters are kept, and reported as kept
    assert no_restore.epochs == 5 and float(no_restore.params["loc"]) == seen[4]
    assert no_restore.best_epoch == 5 and no_restore.best_validation == 0.6


def test_a_fit_resumed_from_a_snapshot_ends_like_the_uninterrupted_fit(tmp_path):
    from ppl_cl.persist import load_tree, save_tree

    y = 0.5 + torch.randn(60, generator=torch.Generator().manual_seed(4), dtype=DT)
    cfg = SVIConfig(learning_rate=0.05, batch_size=16, max_epochs=9, patience=50, seed=7,
                    num_particles=3)

    def validate():  # depends on the parameters; best epoch is restored at the end
        return -round(abs(float(pyro.param("loc").detach()) - 0.4), 2)

    snaps = []
    full = ContinualSVI(normal_model, normal_guide, cfg).fit(
        (y,), validate=validate, checkpoint=snaps.append, checkpoint_every_s=0.0)
    assert [s["epoch"] for s in snaps] == list(range(1, 9))  # not after the last epoch
    assert 1 < full.best_epoch < 9
    for snap in (snaps[0], snaps[4], snaps[7]):
        path = tmp_path / f"snap{snap['epoch']}.npz"
        save_tree(path, snap)  # through the checkpoint format (string keys, no pickle)
        loaded, _ = load_tree(path)
        res = ContinualSVI(normal_model, normal_guide, cfg).fit(
            (y,), validate=validate, resume=loaded)
        assert all(torch.equal(res.params[k], full.params[k]) for k in full.params)
        assert res.epoch_losses == full.epoch_losses and res.validation == full.validation
        assert (res.best_epoch, res.best_validation, res.epochs, res.steps) == \
            (full.best_epoch, full.best_validation, full.epochs, full.steps)
        # the wall time counts the stopped call up to its snapshot, not this call alone
        assert 0.0 < loaded["wall_time_s"] <= res.wall_time_s
        assert res.wall_time_s - loaded["wall_time_s"] < full.wall_time_s + 60.0
    # a snapshot written before snapshots carried their wall time still resumes
    old = {k: v for k, v in snaps[4].items() if k != "wall_time_s"}
    res_old = ContinualSVI(normal_model, normal_guide, cfg).fit(
        (y,), validate=validate, resume=old)
    assert all(torch.equal(res_old.params[k], full.params[k]) for k in full.params)
    # a snapshot of another fit is refused before the loop runs
    with pytest.raises(ValueError, match="runs 3 epochs"):
        ContinualSVI(normal_model, normal_guide, SVIConfig(**{**cfg.__dict__, "max_epochs": 3})
                     ).fit((y,), resume=snaps[4])

    def other_guide(y, num_data=None):
        loc = pyro.param("loc", torch.zeros(2, dtype=y.dtype))
        pyro.sample("mu", dist.Normal(loc.sum(), 1.0))

    with pytest.raises(ValueError, match="do not match"):
        ContinualSVI(normal_model, other_guide, cfg).fit((y,), resume=snaps[0])
    # the time rule: no snapshot before checkpoint_every_s has passed
    few = []
    ContinualSVI(normal_model, normal_guide, cfg).fit((y,), checkpoint=few.append,
                                                      checkpoint_every_s=3600.0)
    assert few == []


def test_progress_bar_and_config_checks(capsys):
    y = torch.randn(20, dtype=DT)
    res = ContinualSVI(normal_model, normal_guide,
                       SVIConfig(batch_size=8, max_epochs=2, progress=True)).fit((y,), desc="task 1")
    assert res.epochs == 2
    assert "task 1" in capsys.readouterr().err
    for kw in (dict(batch_size=0), dict(optimizer="sgd"), dict(learning_rate=-1.0),
               dict(patience=0)):
        with pytest.raises(ValueError, match="SVIConfig"):
            SVIConfig(**kw)
    with pytest.raises(ValueError, match="rows"):
        ContinualSVI(normal_model, normal_guide).fit((y, y[:3]))
    with pytest.raises(ValueError, match="at least one row"):
        ContinualSVI(normal_model, normal_guide).fit((y[:0],))
    with pytest.raises(ValueError, match="no pyro.param"):
        ContinualSVI(normal_model, lambda y, num_data=None: pyro.sample(
            "mu", dist.Normal(0.0, 1.0))).fit((y,))


def test_adam_option_trains_too():
    y = 0.7 + torch.randn(100, generator=torch.Generator().manual_seed(4), dtype=DT)
    res = ContinualSVI(normal_model, normal_guide,
                       SVIConfig(optimizer="adam", learning_rate=0.02, batch_size=100,
                                 max_epochs=300, num_particles=8, vectorize_particles=True,
                                 max_plate_nesting=1)).fit((y,))
    mean, _ = _posterior(y)
    assert abs(float(res.params["loc"]) - mean) < 5 * 0.02


@pytest.mark.gpu
def test_runs_on_cuda():
    y = (0.7 + torch.randn(64, dtype=torch.float32)).cuda()
    res = ContinualSVI(normal_model, normal_guide,
                       SVIConfig(batch_size=16, max_epochs=2, max_plate_nesting=1)).fit((y,))
    assert res.params["loc"].device.type == "cuda"


@pytest.mark.gpu
def test_a_fit_on_cuda_resumed_from_a_snapshot_ends_like_the_uninterrupted_fit(tmp_path):
    """The snapshot carries the CUDA generator's state: the guide draws on the GPU, so a
    resumed fit repeats the uninterrupted one bitwise only if that state is restored (a
    snapshot whose CUDA state is swapped for another ends elsewhere)."""
    from ppl_cl.persist import load_tree, save_tree

    y = (0.5 + torch.randn(60, generator=torch.Generator().manual_seed(4), dtype=DT)).cuda()
    cfg = SVIConfig(learning_rate=0.05, batch_size=16, max_epochs=6, patience=50, seed=7,
                    num_particles=3)
    snaps = []
    full = ContinualSVI(normal_model, normal_guide, cfg).fit(
        (y,), checkpoint=snaps.append, checkpoint_every_s=0.0)
    assert full.params["loc"].device.type == "cuda"
    assert len(snaps[2]["rng"]["cuda"]) == 1  # the one device in use
    path = tmp_path / "snap3.npz"
    save_tree(path, snaps[2])
    loaded, _ = load_tree(path)
    res = ContinualSVI(normal_model, normal_guide, cfg).fit((y,), resume=loaded)
    assert res.params["loc"].device.type == "cuda"
    assert all(torch.equal(res.params[k], full.params[k]) for k in full.params)
    assert res.epoch_losses == full.epoch_losses and res.steps == full.steps
    # control: the same snapshot with another CUDA generator state
    torch.cuda.manual_seed(12345)
    other = {**loaded, "rng": {**loaded["rng"], "cuda": [torch.cuda.get_rng_state()]}}
    res_other = ContinualSVI(normal_model, normal_guide, cfg).fit((y,), resume=other)
    assert res_other.epoch_losses[:3] == full.epoch_losses[:3]  # epochs before the snapshot
    assert res_other.epoch_losses[3:] != full.epoch_losses[3:]


@pytest.mark.parametrize("mode, expected", [("first", [True, True, False, False]),
                                            ("always", [True] * 4), ("never", [False] * 4)])
def test_distribution_checks_run_on_the_first_step_only_by_default(mode, expected):
    """SVIConfig.validate_args: Pyro's argument/support checks (one device read-back each) on
    the initializing evaluation and the first step ("first"), on every step, or never."""
    seen = []

    def model(y, num_data=None):
        seen.append(torch.distributions.Distribution._validate_args)
        w = pyro.param("w", torch.tensor(0.5, dtype=DT))
        with pyro.plate("data", num_data or len(y), subsample=torch.arange(len(y))):
            pyro.sample("y", dist.Normal(w, 1.0), obs=y)

    ContinualSVI(model, lambda y, num_data=None: None,
                 SVIConfig(batch_size=4, max_epochs=3, validate_args=mode)).fit((torch.zeros(4),))
    assert seen == expected
    with pytest.raises(ValueError, match="validate_args"):
        SVIConfig(validate_args="sometimes")

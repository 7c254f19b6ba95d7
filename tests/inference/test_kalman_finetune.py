"""The App. D.2 fine-tuning engine (inference/kalman_finetune.py): one step moves (theta,
log alpha) by the gradient of the chunk's predictive log-loss, checked against central finite
differences of an independent NumPy computation of that loss (eq. 13 with the engine's own
Monte Carlo draws); theta's step is beta * eta and alpha's eta (App. D.1); alpha is learned
only when asked; the engine follows the contract and its recursion is the KalmanFilter's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from inference import kalman as kf
from inference.base import Engine, is_state
from inference.kalman_finetune import FinetuneOptions, KalmanFinetune
from models.kalman import DriftPrior, SoftmaxLikelihood, SurrogateLikelihood

D, M, K, S, B = 3, 4, 3, 8, 5


def _features(theta, x):
    return jnp.tanh(x @ theta["W"])                     # a small nonlinear representation


def _engine(beta=10.0, eta=0.01, learn_calibration=True, fine_tune=True):
    params = kf.KalmanParams(DriftPrior(0.5), SurrogateLikelihood(1 / K))
    options = FinetuneOptions(fine_tune=fine_tune, learn_calibration=learn_calibration,
                              optimizer="sgd", learning_rate=eta, backbone_scale=beta)
    init_theta = lambda key: {"W": jax.random.normal(key, (D, M), jnp.float64)}  # noqa: E731
    return KalmanFinetune(init_theta, _features, M, K, params,
                          kf.FilterOptions(likelihood="softmax", learning_rate=0.1,
                                           num_samples=S), options)


def _state(engine):
    state = engine.init(jax.random.PRNGKey(0), input_dim=D, initial_forgetting=0.9,
                        initial_calibration=1.7, dtype=jnp.float64)
    rng = np.random.default_rng(1)
    L = rng.normal(size=(M, M)) / 2
    kstate = state.filter._replace(mean=jnp.asarray(rng.normal(size=(M, K))),
                                   covariance=jnp.asarray(L @ L.T + 0.1 * np.eye(M)))
    return state._replace(filter=kstate)


def _numpy_loss(W, log_alpha, kstate, x, y, eps, s_w2=0.5):
    """-(1/b) sum_i log (1/S) sum_s softmax(alpha (mu_i + s_i eps_is))_{y_i} (eq. 13) with the
    prediction step of eq. 7 written out: mu = gamma M^T phi, s^2 = gamma^2 phi^T A phi +
    (1 - gamma^2) s_w2 |phi|^2."""
    phi = np.tanh(x @ W)
    M_, A = np.asarray(kstate.mean), np.asarray(kstate.covariance)
    g2 = np.exp(-float(kstate.delta))
    mu = np.sqrt(g2) * phi @ M_                                          # (b, K)
    s2 = g2 * np.einsum("bi,ij,bj->b", phi, A, phi) + (1 - g2) * s_w2 * (phi**2).sum(1)
    logits = np.exp(log_alpha) * (mu[:, None, :] + np.sqrt(s2)[:, None, None] * eps)
    logits = logits - logits.max(-1, keepdims=True)
    logsm = logits - np.log(np.exp(logits).sum(-1, keepdims=True))       # (b, S, K)
    lp = np.log(np.exp(logsm[np.arange(len(y)), :, y]).mean(1))          # (b,)
    return -lp.mean()


def _batch():
    rng = np.random.default_rng(2)
    return rng.normal(size=(B, D)), rng.integers(0, K, size=B)


def _loss_draws(rng):
    """The standard normals of the loss in KalmanFinetune.step: key 2 of split(rng, 3)."""
    _, k_loss, _ = jax.random.split(rng, 3)
    return np.asarray(jax.random.normal(k_loss, (B * S * K,), jnp.float64)).reshape(B, S, K)


def test_step_is_the_gradient_of_the_chunk_log_loss_with_beta_and_eta():
    beta, eta = 10.0, 0.01
    engine = _engine(beta, eta)
    state = _state(engine)
    x, y = _batch()
    rng = jax.random.PRNGKey(3)
    new, info = jax.jit(engine.step)(rng, state, (jnp.asarray(x), jnp.asarray(y)))
    eps = _loss_draws(rng)
    W0, la0 = np.asarray(state.theta["W"]), float(state.log_alpha)
    # the reported loss is the NumPy loss at the old parameters
    np.testing.assert_allclose(float(info.loss), _numpy_loss(W0, la0, state.filter, x, y, eps),
                               rtol=1e-10)
    h = 1e-6
    fd_W = np.zeros_like(W0)
    for idx in np.ndindex(W0.shape):
        Wp, Wm = W0.copy(), W0.copy()
        Wp[idx] += h
        Wm[idx] -= h
        fd_W[idx] = (_numpy_loss(Wp, la0, state.filter, x, y, eps)
                     - _numpy_loss(Wm, la0, state.filter, x, y, eps)) / (2 * h)
    fd_la = (_numpy_loss(W0, la0 + h, state.filter, x, y, eps)
             - _numpy_loss(W0, la0 - h, state.filter, x, y, eps)) / (2 * h)
    # SGD: theta <- theta - beta eta dL/dtheta,  log alpha <- log alpha - eta dL/dlog alpha
    np.testing.assert_allclose((W0 - np.asarray(new.theta["W"])) / (beta * eta), fd_W,
                               rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose((la0 - float(new.log_alpha)) / eta, fd_la, rtol=1e-6)
    assert abs(fd_la) > 1e-3 and np.abs(fd_W).max() > 1e-3        # the steps are not trivial
    # the prequential log predictive: the chunk's own points before the step
    np.testing.assert_allclose(float(info.prequential_log_predictive), -float(info.loss),
                               rtol=1e-10)                          # no replay here


def test_alpha_is_learned_only_when_asked_and_theta_only_when_fine_tuned():
    x, y = _batch()
    batch = (jnp.asarray(x), jnp.asarray(y))
    rng = jax.random.PRNGKey(4)
    fixed_alpha = _engine(learn_calibration=False)
    state = _state(fixed_alpha)
    new, _ = fixed_alpha.step(rng, state, batch)
    assert float(new.log_alpha) == float(state.log_alpha)
    assert not np.array_equal(np.asarray(new.theta["W"]), np.asarray(state.theta["W"]))
    frozen = _engine(fine_tune=False)
    state = _state(frozen)
    new, _ = frozen.step(rng, state, batch)
    np.testing.assert_array_equal(np.asarray(new.theta["W"]), np.asarray(state.theta["W"]))
    assert float(new.log_alpha) != float(state.log_alpha)


def test_recursion_runs_on_the_new_features_and_engine_follows_the_contract():
    engine = _engine()
    assert isinstance(engine, Engine)
    state = _state(engine)
    assert is_state(state)
    x, y = _batch()
    rng = jax.random.PRNGKey(5)
    new, info = engine.step(rng, state, (jnp.asarray(x), jnp.asarray(y)))
    assert is_state(new) and is_state(info)
    # App. D.2: the Kalman recursion sees phi(x; theta_new) at alpha_new
    _, _, k_rec = jax.random.split(rng, 3)
    params = engine.params._replace(readout=SoftmaxLikelihood(jnp.exp(new.log_alpha)))
    ref, _ = kf.KalmanFilter(params, engine.filter_options).step(
        k_rec, state.filter, (_features(new.theta, jnp.asarray(x)), jnp.asarray(y),
                              jnp.ones(B, bool)))
    for u, v in zip(new.filter, ref):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-12, atol=1e-14)
    assert all(bool(v) for v in info.finite.values())


@pytest.mark.parametrize("transition", ["always", "last", "first"])
def test_identity_features_with_replay_stay_finite(transition):
    """Issue 65 item 1 at the engine: identity features, a replay memory that is still empty
    (zero rows appended), every transition mode."""
    params = kf.KalmanParams(DriftPrior(0.1), SurrogateLikelihood(0.1))
    engine = KalmanFinetune(lambda key: [], lambda theta, x: x, 6, 4, params,
                            kf.FilterOptions(likelihood="softmax", learning_rate=0.5,
                                             num_samples=4),
                            FinetuneOptions(replay_capacity=20, replay_size=10,
                                            transition=transition))
    state = engine.init(jax.random.PRNGKey(0), input_dim=6, dtype=jnp.float64)
    step = jax.jit(engine.step)
    rng = np.random.default_rng(6)
    for c in range(3):
        batch = (jnp.asarray(rng.normal(size=(5, 6))), jnp.asarray(rng.integers(0, 4, 5)))
        state, info = step(jax.random.PRNGKey(c), state, batch)
        assert all(bool(v) for v in info.finite.values()), info.finite
    assert int(state.memory.size) == 15

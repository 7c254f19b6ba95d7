"""The representation networks phi(x; theta) (models/feature_networks.py): the MLP against a
NumPy forward pass, the identity, App. D.3's normalization and bias, per-example independence
of the image networks (GroupNorm: a chunk's prediction does not depend on the other points of
the chunk), determinism, and the configuration errors."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.feature_networks import FEATURE_NETWORKS, feature_network, with_postprocessing

_ARGS = {
    "identity": ({}, 12),
    "mlp": ({"feature_dim": 5, "hidden": (7,)}, 12),
    "cnn": ({"feature_dim": 6, "input_shape": (8, 8, 1), "channels": (4, 4)}, 64),
    "resnet18": ({"feature_dim": 6, "input_shape": (8, 8, 3), "width": 4}, 192),
}


def test_every_named_network_is_tested():
    assert set(_ARGS) == set(FEATURE_NETWORKS)


@pytest.mark.parametrize("name", FEATURE_NETWORKS)
def test_networks_shapes_determinism_and_per_example_independence(name):
    kwargs, d = _ARGS[name]
    net = feature_network(name, input_dim=d, dtype=jnp.float64, **kwargs)
    theta = net.init(jax.random.PRNGKey(0))
    x = jnp.asarray(np.random.default_rng(4).uniform(size=(3, d)))
    phi = np.asarray(net.apply(theta, x))
    assert phi.shape == (3, net.feature_dim)
    assert np.all(np.isfinite(phi))
    # same key, same parameters
    np.testing.assert_array_equal(phi, np.asarray(net.apply(net.init(jax.random.PRNGKey(0)), x)))
    # each row depends on its own input only (no batch statistics): change the other rows
    x2 = x.at[0].set(x[0] * 3.0).at[2].set(0.0)
    np.testing.assert_allclose(np.asarray(net.apply(theta, x2))[1], phi[1], rtol=1e-12,
                               atol=1e-14)
    if name == "identity":
        np.testing.assert_array_equal(phi, np.asarray(x))
    else:
        # different keys give different features
        other = np.asarray(net.apply(net.init(jax.random.PRNGKey(1)), x))
        assert np.abs(other - phi).max() > 1e-6


def test_mlp_equals_a_numpy_forward_pass_with_he_initialization():
    d, hidden, m = 30, (40,), 20
    net = feature_network("mlp", input_dim=d, feature_dim=m, hidden=hidden, dtype=jnp.float64)
    theta = net.init(jax.random.PRNGKey(2))
    x = np.random.default_rng(3).normal(size=(5, d))
    h = x
    for layer in theta:
        h = np.maximum(h @ np.asarray(layer["w"]) + np.asarray(layer["b"]), 0.0)
    np.testing.assert_allclose(np.asarray(net.apply(theta, jnp.asarray(x))), h, rtol=1e-12)
    # He initialization: weights N(0, 2 / fan_in), zero biases
    w0 = np.asarray(theta[0]["w"])
    assert w0.shape == (d, 40) and np.all(np.asarray(theta[0]["b"]) == 0)
    assert abs(w0.var() / (2.0 / d) - 1.0) < 4 * math.sqrt(2.0 / w0.size)


def test_postprocessing_normalizes_then_appends_the_bias():
    net = feature_network("mlp", input_dim=4, feature_dim=9, hidden=(6,), dtype=jnp.float64)
    theta = net.init(jax.random.PRNGKey(5))
    x = jnp.asarray(np.random.default_rng(6).normal(size=(3, 4)))
    raw = np.asarray(net.apply(theta, x))
    both = with_postprocessing(net, normalization=True, bias=True)
    assert both.feature_dim == 10
    np.testing.assert_allclose(np.asarray(both.apply(theta, x)),
                               np.concatenate([raw / 3.0, np.ones((3, 1))], axis=1), rtol=1e-12)
    assert with_postprocessing(net) is net


def test_feature_network_rejects_bad_configurations():
    with pytest.raises(ValueError, match="feature network"):
        feature_network("transformer", input_dim=4, feature_dim=2)
    with pytest.raises(ValueError, match="feature_dim"):
        feature_network("mlp", input_dim=4)
    with pytest.raises(ValueError, match="input_shape"):
        feature_network("cnn", input_dim=10, feature_dim=2, input_shape=(3, 3, 1))

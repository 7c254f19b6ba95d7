"""Predictive objects against scipy.stats."""

import numpy as np
import pytest
from scipy import stats

from ppl_cl import CategoricalPredictive, GaussianPredictive


def test_gaussian_log_prob_sample_interval():
    p = GaussianPredictive(np.array([0.0, 1.0, -2.0]), np.array([1.0, 0.25, 4.0]))
    y = np.array([0.3, 0.9, 1.0])
    np.testing.assert_allclose(p.log_prob(y), stats.norm(p.mean, p.stddev).logpdf(y), rtol=1e-13)
    draws = p.sample(20000, seed=0)
    assert draws.shape == (20000, 3)
    # sample mean within 4 standard errors of the mean
    assert np.all(np.abs(draws.mean(0) - p.mean) < 4 * p.stddev / np.sqrt(20000))
    lo, hi = p.interval(0.9)
    np.testing.assert_allclose(lo, stats.norm(p.mean, p.stddev).ppf(0.05), rtol=1e-12)
    np.testing.assert_allclose(hi, stats.norm(p.mean, p.stddev).ppf(0.95), rtol=1e-12)
    with pytest.raises(ValueError, match=r"y: expected shape \(3,\)"):
        p.log_prob(np.zeros(2))
    with pytest.raises(ValueError, match="variance"):
        GaussianPredictive(np.zeros(3), np.ones(2))


def test_categorical():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    p = CategoricalPredictive(probs)
    np.testing.assert_allclose(p.log_prob(np.array([0, 2])), np.log([0.7, 0.8]))
    np.testing.assert_allclose(p.entropy(), stats.entropy(probs, axis=1))
    assert p.accuracy(np.array([0, 1])) == 0.5
    assert list(p.predicted_class()) == [0, 2]
    s = p.sample(30000, seed=1)
    freq = np.stack([(s == k).mean(0) for k in range(3)], axis=1)
    se = np.sqrt(probs * (1 - probs) / 30000)
    assert np.all(np.abs(freq - probs) < 4 * se + 1e-12)
    with pytest.raises(ValueError, match=r"labels in 0\.\.2"):
        p.log_prob(np.array([0, 3]))
    with pytest.raises(ValueError, match="finite"):
        CategoricalPredictive(np.array([[np.nan, 1.0]]))
    zero = CategoricalPredictive(np.array([[1.0, 0.0]]))
    assert np.isfinite(zero.log_prob(np.array([1]))).all()

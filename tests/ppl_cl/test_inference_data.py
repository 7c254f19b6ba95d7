"""ArviZ export: diagnostics on known cases, LOO against the closed form, Gaussian draws against
their moments (k Monte Carlo standard errors), netCDF round trips and input validation."""

from __future__ import annotations

import math
import sys
import types

import arviz as az
import numpy as np
import pytest
import torch
import xarray as xr

from ppl_cl.inference_data import (
    FILTERING_GROUP,
    JitterWarning,
    _from_dict_v1,
    from_nested_dict,
    gaussian_draws,
    gaussian_log_likelihood,
    gaussian_to_inference_data,
    pointwise_log_likelihood,
    samples_to_inference_data,
    trajectories_to_dataset,
)

K_SE = 4.0  # Monte Carlo tolerances are K_SE standard errors


# -- diagnostics on known cases --------------------------------------------------------------
def test_summary_of_iid_chains_and_of_shifted_chains():
    rng = np.random.default_rng(0)
    chains, draws = 4, 1000
    N = chains * draws
    idata = samples_to_inference_data({"theta": rng.standard_normal((chains, draws))})
    row = az.summary(idata).loc["theta"]
    assert 0.99 <= row["r_hat"] <= 1.01
    # ESS of iid draws is N up to the estimator's own Monte Carlo error, measured here on
    # independent replicates (its sd is about 0.04 N for 4 x 1000 draws).
    reps = np.array([float(az.ess(rng.standard_normal((chains, draws)), method="bulk"))
                     for _ in range(100)]) / N
    assert abs(row["ess_bulk"] / N - 1.0) <= 5 * reps.std()

    shifted = rng.standard_normal((chains, draws)) + np.array([0.0, 0.0, 0.0, 3.0])[:, None]
    row = az.summary(samples_to_inference_data({"theta": shifted})).loc["theta"]
    assert row["r_hat"] > 1.1


def test_dims_and_coords_land_where_given():
    rng = np.random.default_rng(0)
    idata = samples_to_inference_data(
        {"w": rng.normal(size=(2, 10, 3)), "b": rng.normal(size=(2, 10))},
        dims={"w": ["feature"], "y": ["obs"]},
        coords={"feature": ["a", "b", "c"], "obs": [10, 20]},
        observed_data={"y": np.array([1.0, 2.0])},
        constant_data={"noise": np.array([0.1])})
    assert idata.posterior["w"].dims == ("chain", "draw", "feature")
    assert list(idata.posterior["feature"].values) == ["a", "b", "c"]
    assert idata.posterior["b"].dims == ("chain", "draw")
    assert idata.observed_data["y"].dims == ("obs",)
    assert list(idata.observed_data["obs"].values) == [10, 20]
    np.testing.assert_array_equal(idata.posterior["chain"].values, [0, 1])


def test_accepts_torch_and_jax_arrays():
    import jax.numpy as jnp

    t = torch.randn(2, 5, 3, requires_grad=True)
    j = jnp.arange(10.0).reshape(2, 5)
    idata = samples_to_inference_data({"t": t, "j": j})
    np.testing.assert_allclose(idata.posterior["t"].values, t.detach().numpy())
    np.testing.assert_allclose(idata.posterior["j"].values, np.arange(10.0).reshape(2, 5))


# -- LOO on a conjugate model, against the closed form ---------------------------------------------
def test_loo_of_conjugate_normal_mean_matches_closed_form():
    """y_i ~ N(theta, 1), theta ~ N(0, tau^2). Exact leave-one-out predictive:
    p(y_i | y_-i) = N(y_i | m_-i, 1 / P_-i + 1) with P_-i = n - 1 + 1 / tau^2 and
    m_-i = (sum_j y_j - y_i) / P_-i. PSIS-LOO from S posterior draws estimates
    log p(y_i | y_-i) = -log mean_s w_is, w_is = 1 / p(y_i | theta_s); by the delta method its
    Monte Carlo sd is sd_s(w_i) / (sqrt(S) mean_s(w_i)), summed over i (a conservative bound)."""
    rng = np.random.default_rng(3)
    n, tau2, S = 30, 100.0, 4000
    y = rng.normal(0.7, 1.0, size=n)
    P = n + 1.0 / tau2
    m = y.sum() / P

    def log_lik(d):
        theta = np.broadcast_to(d["theta"][..., None], d["theta"].shape + (n,))
        return {"y": gaussian_log_likelihood(theta, y, 1.0)}

    idata = gaussian_to_inference_data({"theta": np.array(m)}, variance={"theta": np.array(1 / P)},
                                       num_draws=S, seed=0, log_likelihood=log_lik,
                                       observed_data={"y": y}, dims={"y": ["obs"]})
    assert idata.log_likelihood["y"].dims == ("chain", "draw", "obs")
    loo = az.loo(idata)
    waic = az.waic(idata)
    assert np.isfinite(loo.elpd_loo) and np.isfinite(waic.elpd_waic)

    P_i = P - 1.0
    m_i = (y.sum() - y) / P_i
    v_i = 1.0 / P_i + 1.0
    exact = float(np.sum(-0.5 * np.log(2 * np.pi * v_i) - 0.5 * (y - m_i) ** 2 / v_i))
    w = np.exp(-idata.log_likelihood["y"].values.reshape(S, n))
    mc_sd = float(np.sum(w.std(axis=0) / (math.sqrt(S) * w.mean(axis=0))))
    assert abs(loo.elpd_loo - exact) <= K_SE * mc_sd
    assert loo.p_loo == pytest.approx(1.0, abs=0.5)  # one parameter


def test_pointwise_log_likelihood_dataset():
    ll = -np.abs(np.random.default_rng(0).normal(size=(50, 4)))  # (draws, n): one chain
    ds = pointwise_log_likelihood(ll, var_name="z", obs_dim="point", obs_coords=[5, 6, 7, 8])
    assert ds["z"].dims == ("chain", "draw", "point")
    assert ds["z"].shape == (1, 50, 4)
    np.testing.assert_array_equal(ds["point"].values, [5, 6, 7, 8])
    with pytest.raises(ValueError, match="NaN"):
        pointwise_log_likelihood(np.full((1, 3, 2), np.nan))
    with pytest.raises(ValueError, match=r"\(chains, draws, n\)"):
        pointwise_log_likelihood(np.zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match=r"obs_coords: expected shape \(4,\)"):
        pointwise_log_likelihood(ll, obs_coords=[1, 2])


def test_gaussian_log_likelihood_matches_formula():
    rng = np.random.default_rng(0)
    f = rng.normal(size=(2, 3, 4))
    y = rng.normal(size=4)
    s2 = 0.3
    expected = -0.5 * np.log(2 * np.pi * s2) - 0.5 * (y - f) ** 2 / s2
    np.testing.assert_allclose(gaussian_log_likelihood(f, y, s2), expected, rtol=1e-13)
    with pytest.raises(ValueError, match="> 0"):
        gaussian_log_likelihood(f, y, 0.0)
    with pytest.raises(ValueError, match=r"\(chains, draws, n\)"):
        gaussian_log_likelihood(f, y[:3], s2)


# -- Gaussian draws ------------------------------------------------------------------------------
def _assert_moments(x: np.ndarray, mu: np.ndarray, Sigma: np.ndarray) -> None:
    """Sample mean within K_SE sqrt(S_ii / S); sample covariance entries within
    K_SE sqrt((S_ii S_jj + S_ij^2) / S) (the variance of a Gaussian sample covariance)."""
    S = x.shape[0]
    np.testing.assert_array_less(np.abs(x.mean(axis=0) - mu), K_SE * np.sqrt(np.diag(Sigma) / S))
    d = np.diag(Sigma)
    se = np.sqrt((np.outer(d, d) + Sigma**2) / S)
    np.testing.assert_array_less(np.abs(np.cov(x, rowvar=False) - Sigma), K_SE * se)


SIGMA3 = np.array([[2.0, 0.5, 0.3], [0.5, 1.0, -0.2], [0.3, -0.2, 0.5]])


def test_gaussian_draws_joint_covariance():
    mu = np.array([1.0, -2.0, 0.5])
    d = gaussian_draws({"f": mu}, {"f": SIGMA3}, num_draws=20000, seed=0)
    assert d["f"].shape == (1, 20000, 3)
    _assert_moments(d["f"][0], mu, SIGMA3)


def test_gaussian_draws_joint_over_a_matrix_mean():
    rng = np.random.default_rng(1)
    B = rng.normal(size=(6, 6))
    Sigma = B @ B.T / 6 + 0.1 * np.eye(6)
    mu = rng.normal(size=(2, 3))
    x = gaussian_draws({"W": mu}, {"W": Sigma}, num_draws=20000, seed=1)["W"][0]
    assert x.shape == (20000, 2, 3)
    _assert_moments(x.reshape(20000, 6), mu.reshape(6), Sigma)


def test_gaussian_draws_rows_share_or_own_a_covariance():
    # Kalman classifier: K = 2 readout rows sharing A (3 x 3), independent across rows
    mu = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    for cov in (SIGMA3, np.stack([SIGMA3, 2.0 * SIGMA3])):
        x = gaussian_draws({"W": mu}, {"W": cov}, num_draws=20000, seed=2)["W"][0]
        covs = np.broadcast_to(cov, (2, 3, 3))
        joint = np.zeros((6, 6))
        joint[:3, :3], joint[3:, 3:] = covs[0], covs[1]
        _assert_moments(x.reshape(20000, 6), mu.reshape(6), joint)


def test_gaussian_draws_independent_variances_and_scalars():
    mu = np.array([0.5, -1.0])
    var = np.array([0.25, 4.0])
    d = gaussian_draws({"a": mu, "s": 2.0}, variance={"a": var, "s": 0.5}, num_draws=20000,
                       seed=3)
    _assert_moments(d["a"][0], mu, np.diag(var))
    assert d["s"].shape == (1, 20000)
    _assert_moments(d["s"][0][:, None], np.array([2.0]), np.array([[0.5]]))


def test_gaussian_draws_are_reproducible():
    a = gaussian_draws({"f": np.zeros(3)}, {"f": SIGMA3}, num_draws=5, seed=7)["f"]
    b = gaussian_draws({"f": np.zeros(3)}, {"f": SIGMA3}, num_draws=5, seed=7)["f"]
    c = gaussian_draws({"f": np.zeros(3)}, {"f": SIGMA3}, num_draws=5, seed=8)["f"]
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_gaussian_draws_singular_covariance_needs_jitter():
    v = np.array([1.0, 2.0, 3.0])
    with pytest.warns(JitterWarning, match="jitter"):
        x = gaussian_draws({"f": np.zeros(3)}, {"f": np.outer(v, v)}, num_draws=4000,
                           seed=0)["f"][0]
    # rank one: every draw lies on the line through v (up to the jitter, 1e-10 x mean diag)
    t = x[:, 0]
    np.testing.assert_allclose(x, t[:, None] * v, atol=1e-3)
    assert abs(t.var() - 1.0) <= K_SE * math.sqrt(2.0 / 4000)


def test_gaussian_draws_validation():
    with pytest.raises(ValueError, match="smallest eigenvalue"):
        gaussian_draws({"f": np.zeros(2)}, {"f": np.array([[1.0, 2.0], [2.0, 1.0]])})
    with pytest.raises(ValueError, match="symmetric"):
        gaussian_draws({"f": np.zeros(2)}, {"f": np.array([[1.0, 0.5], [0.0, 1.0]])})
    # symmetry to the input's precision: float32 rounding passes, the same gap in float64 not
    skew = np.array([[1.0, 0.5], [0.5 + 1e-6, 1.0]])
    x = gaussian_draws({"f": np.zeros(2)}, {"f": torch.tensor(skew, dtype=torch.float32)},
                       num_draws=3)["f"]
    assert x.shape == (1, 3, 2)
    with pytest.raises(ValueError, match="symmetric"):
        gaussian_draws({"f": np.zeros(2)}, {"f": skew})
    with pytest.raises(ValueError, match=r"expected shape \(6, 6\)"):
        gaussian_draws({"W": np.zeros((2, 3))}, {"W": np.eye(4)})
    with pytest.raises(ValueError, match="neither"):
        gaussian_draws({"f": np.zeros(2)})
    with pytest.raises(ValueError, match="both"):
        gaussian_draws({"f": np.zeros(2)}, {"f": np.eye(2)}, variance={"f": np.ones(2)})
    with pytest.raises(ValueError, match="no entry in mean"):
        gaussian_draws({"f": np.zeros(2)}, {"g": np.eye(2)})
    with pytest.raises(ValueError, match=r"variance\['f'\]: expected shape \(2,\)"):
        gaussian_draws({"f": np.zeros(2)}, variance={"f": np.ones(3)})
    with pytest.raises(ValueError, match=">= 0"):
        gaussian_draws({"f": np.zeros(2)}, variance={"f": -np.ones(2)})
    with pytest.raises(ValueError, match="num_draws"):
        gaussian_draws({"f": np.zeros(2)}, variance={"f": np.ones(2)}, num_draws=0)


# -- trajectories and the netCDF round trip -------------------------------------------------
def test_trajectories_dataset():
    gamma = np.linspace(1.0, 0.5, 6)
    ds = trajectories_to_dataset({"gamma": gamma, "mean": np.zeros((6, 2))},
                                 time=np.arange(1, 7) * 10, dims={"mean": ["feature"]},
                                 coords={"feature": ["u", "v"], "unused": [1, 2, 3]})
    assert ds["gamma"].dims == ("time",)
    assert ds["mean"].dims == ("time", "feature")
    np.testing.assert_array_equal(ds["time"].values, np.arange(1, 7) * 10)
    assert "unused" not in ds.coords
    with pytest.raises(ValueError, match="expected 6 time steps"):
        trajectories_to_dataset({"a": np.zeros(6), "b": np.zeros(5)})
    with pytest.raises(ValueError, match=r"time: expected shape \(6,\)"):
        trajectories_to_dataset({"a": np.zeros(6)}, time=np.arange(3))
    with pytest.raises(ValueError, match="scalar"):
        trajectories_to_dataset({"a": 1.0})


def test_netcdf_round_trip_of_every_group(tmp_path):
    rng = np.random.default_rng(0)
    n, S = 5, 200
    y = rng.normal(size=n)

    def log_lik(d):  # y_i ~ N(w_0, 1): a narrow posterior, so PSIS-LOO is well behaved
        w0 = np.broadcast_to(d["w"][..., :1], d["w"].shape[:2] + (n,))
        return pointwise_log_likelihood(gaussian_log_likelihood(w0, y, 1.0))

    idata = gaussian_to_inference_data(
        {"w": np.zeros(2)}, {"w": 0.01 * np.eye(2)}, num_draws=S, seed=0,
        dims={"w": ["feature"], "y": ["obs"], "mean": ["feature"], "w_new": ["obs_new"],
              "x_new": ["obs_new"]},
        coords={"feature": ["a", "b"], "time": np.arange(4) * 10},
        log_likelihood=log_lik, observed_data={"y": y},
        constant_data={"noise_variance": np.array([0.1])},
        sample_stats={"lp": rng.normal(size=(4, S // 4))},
        trajectories={"gamma": np.array([1.0, 0.9, 0.7, 0.8]), "mean": rng.normal(size=(4, 2))},
        predictions=lambda d: {"w_new": d["w"][..., 0:1] + np.zeros(3)},
        predictions_constant_data={"x_new": np.arange(3.0)},
        attrs={"learner": "kalman", "num_tasks": 3})
    # independent draws: 4 chains by default, and the attributes say so
    assert idata.posterior["w"].shape == (4, S // 4, 2)
    assert idata.attrs["sampling"] == "independent draws"
    groups = ["posterior", "log_likelihood", "sample_stats", "observed_data", "constant_data",
              "predictions", "predictions_constant_data", FILTERING_GROUP]
    assert set(groups) <= set(idata.groups())
    np.testing.assert_array_equal(idata.predictions["w_new"].values[..., 2],
                                  idata.posterior["w"].values[..., 0])
    assert idata.filtering["mean"].dims == ("time", "feature")
    np.testing.assert_array_equal(idata.filtering["time"].values, [0, 10, 20, 30])
    path = tmp_path / "posterior.nc"
    idata.to_netcdf(str(path))
    back = az.from_netcdf(str(path))
    for group in groups:
        original, loaded = idata[group], back[group]
        assert set(loaded.data_vars) == set(original.data_vars), group
        for var in original.data_vars:
            assert loaded[var].dims == original[var].dims, (group, var)
            np.testing.assert_array_equal(loaded[var].values, original[var].values)
        assert loaded.attrs["learner"] == "kalman"
        assert int(loaded.attrs["num_tasks"]) == 3
    assert back.attrs["sampling"] == "independent draws"
    assert np.isfinite(az.loo(back).elpd_loo)


def test_chains_of_independent_draws():
    """default_chains: up to 4 chains of at least 4 draws; split_chains keeps the order;
    gaussian_draws gives the same draws whatever the chain count."""
    from ppl_cl.inference_data import default_chains, split_chains

    assert [default_chains(n) for n in (1, 7, 8, 10, 12, 50, 200, 15)] == [1, 1, 2, 2, 3, 2, 4, 3]
    a = np.arange(24.0).reshape(1, 12, 2)
    np.testing.assert_array_equal(split_chains({"a": a})["a"], a.reshape(3, 4, 2))
    np.testing.assert_array_equal(split_chains({"a": a}, 2)["a"].reshape(1, 12, 2), a)
    with pytest.raises(ValueError, match="multiple of num_chains"):
        split_chains({"a": a}, 5)
    with pytest.raises(ValueError, match=r"expected shape \(1, draws, ...\)"):
        split_chains({"a": np.zeros((2, 3))})
    one = gaussian_draws({"f": np.zeros(3)}, {"f": SIGMA3}, num_draws=12, seed=4)["f"]
    four = gaussian_draws({"f": np.zeros(3)}, {"f": SIGMA3}, num_draws=12, num_chains=4,
                          seed=4)["f"]
    assert one.shape == (1, 12, 3) and four.shape == (4, 3, 3)
    np.testing.assert_array_equal(four.reshape(1, 12, 3), one)
    summary = az.summary(samples_to_inference_data(
        gaussian_draws({"f": np.zeros(3)}, {"f": SIGMA3}, num_draws=4000, num_chains=4)),
        kind="diagnostics")
    assert (summary["r_hat"] < 1.01).all()


# -- validation -----------------------------------------------------------------------------------
def test_bad_shapes_and_arguments_raise_clear_errors():
    good = np.zeros((2, 10))
    with pytest.raises(ValueError, match=r"posterior\['a'\]: expected leading \(chain, draw\)"):
        samples_to_inference_data({"a": np.zeros(10)})
    with pytest.raises(ValueError, match=r"expected \(chain, draw\) = \(2, 10\)"):
        samples_to_inference_data({"a": good}, log_likelihood={"y": np.zeros((2, 5, 3))})
    with pytest.raises(ValueError, match=r"dims\['a'\]"):
        samples_to_inference_data({"a": np.zeros((2, 10, 3))}, dims={"a": ["x", "z"]})
    with pytest.raises(ValueError, match=r"coords\['x'\]: expected 3 labels"):
        samples_to_inference_data({"a": np.zeros((2, 10, 3))}, dims={"a": ["x"]},
                                  coords={"x": [1, 2]})
    with pytest.raises(ValueError, match="unknown group 'filtering'"):
        from_nested_dict({"posterior": {"a": good}, "filtering": {"g": np.zeros(3)}})
    with pytest.raises(ValueError, match="leading dimensions"):
        from_nested_dict({"posterior": xr.Dataset({"a": (("x",), np.zeros(3))})})
    with pytest.raises(TypeError, match="numeric"):
        samples_to_inference_data({"a": np.array([["u"]])})
    with pytest.raises(TypeError, match=r"attrs\['bad'\]"):
        samples_to_inference_data({"a": good}, attrs={"bad": {"nested": 1}})
    with pytest.raises(ValueError, match="non-empty"):
        samples_to_inference_data({})
    with pytest.raises(ValueError, match="at least one non-empty group"):
        from_nested_dict({"posterior": None})


def test_prior_family_may_have_its_own_draws():
    idata = from_nested_dict({"posterior": {"a": np.zeros((2, 10))},
                              "prior": {"a": np.zeros((1, 30))}})
    assert idata.prior["a"].shape == (1, 30)


# -- ArviZ 1.x dispatch -------------------------------------------------------------------------
def test_arviz_1x_receives_the_nested_dict(monkeypatch):
    calls = []

    def fake_from_dict(data, *, dims=None, coords=None):
        calls.append((data, dims, coords))
        return xr.DataTree.from_dict({g: xr.Dataset({k: xr.DataArray(v) for k, v in d.items()})
                                      for g, d in data.items()})

    monkeypatch.setitem(sys.modules, "arviz",
                        types.SimpleNamespace(__version__="1.0.0", from_dict=fake_from_dict))
    tree = samples_to_inference_data({"a": torch.zeros(2, 3)}, observed_data={"y": [1.0]},
                                     dims={"y": ["obs"]}, trajectories={"g": np.ones(4)},
                                     attrs={"learner": "x"})
    (data, dims, coords), = calls
    assert set(data) == {"posterior", "observed_data"}
    assert isinstance(data["posterior"]["a"], np.ndarray)
    assert dims == {"y": ["obs"]} and coords is None
    assert set(tree.children) == {"posterior", "observed_data", FILTERING_GROUP}
    assert tree[FILTERING_GROUP]["g"].dims == ("time",)
    assert tree.attrs["learner"] == "x" and tree["posterior"].attrs["learner"] == "x"


def test_arviz_base_from_dict_when_available():
    arviz_base = pytest.importorskip("arviz_base")
    tree = _from_dict_v1(arviz_base.from_dict,
                         {"posterior": {"w": np.zeros((2, 5, 3))},
                          "observed_data": {"y": np.ones(4)}},
                         {FILTERING_GROUP: trajectories_to_dataset({"g": np.ones(6)})},
                         {"w": ["feature"], "y": ["obs"]}, {"feature": ["a", "b", "c"]})
    assert tree["posterior"]["w"].dims == ("chain", "draw", "feature")
    assert tree["observed_data"]["y"].dims == ("obs",)
    assert tree[FILTERING_GROUP]["g"].dims == ("time",)


def test_trajectories_given_as_dataset_keep_their_time_coordinate():
    """A Dataset is a Mapping too: it must be kept as built, not rebuilt (time coords lost)."""
    ds = trajectories_to_dataset({"gamma": np.array([1.0, 0.9, 0.8])}, time=np.array([10, 20, 30]))
    idata = samples_to_inference_data({"w": np.zeros((1, 4, 2))}, dims={"w": ["feature"]},
                                      trajectories=ds)
    np.testing.assert_array_equal(idata[FILTERING_GROUP]["time"].values, [10, 20, 30])

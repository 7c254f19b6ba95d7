"""ArviZ export shared by every learner's ``to_inference_data`` (docs/design.md, the learner protocol).

One entry point, :func:`from_nested_dict`, takes groups in ArviZ 1.x's nested form::

    from_nested_dict({"posterior": {"w": draws},            # (chain, draw, ...)
                      "log_likelihood": {"y": log_lik},     # (chain, draw, n)
                      "observed_data": {"y": y},            # (n,)
                      "filtering": trajectories_to_dataset({"gamma": gamma_n})},
                     dims={"w": ["feature"], "y": ["obs"]}, coords={"obs": np.arange(n)})

and dispatches to the installed ArviZ: 0.x gets the groups as keyword arguments of
``az.from_dict``; 1.x gets the nested dict. Arrays may be NumPy, torch or JAX. Everything is
checked before ArviZ sees it, so a wrong shape names the group, the variable and the expected
layout instead of surfacing as an xarray error.

Group conventions
-----------------
* **sample groups** (``posterior``, ``posterior_predictive``, ``predictions``, ``sample_stats``,
  ``log_likelihood``, ``prior``, ``prior_predictive``, ``sample_stats_prior``): every variable
  has leading ``(chain, draw)`` axes, shared by the whole posterior (resp. prior) family so that
  ``az.loo`` / ``az.waic`` can pair ``log_likelihood`` with ``posterior``;
* **data groups** (``observed_data``, ``constant_data``, ``predictions_constant_data``): no sample
  axes (hyperparameter point estimates go to ``constant_data``);
* **filtered trajectories** — quantities indexed by time rather than by draw, such as the
  forgetting coefficient ``gamma_n`` and calibration ``alpha_n`` of the Kalman filter (Titsias et
  al. 2024, Fig. 1-2) or a filtered mean — go to the custom group ``"filtering"``
  (:data:`FILTERING_GROUP`) with leading dimension ``time``. They are not ``sample_stats``
  (those are per-draw and would be read as ``(chain, draw)`` by ArviZ's diagnostics). ArviZ 0.x
  ``InferenceData`` and 1.x ``DataTree`` both keep custom groups through ``to_netcdf`` /
  ``from_netcdf``; diagnostics simply ignore them.

Any group given as an ``xarray.Dataset`` is attached as is (after the same checks for sample
groups); custom group names must be given this way (see :func:`trajectories_to_dataset`).

What the learners write
-----------------------
* ``log_likelihood`` holds the data the posterior was conditioned on (the training points), so
  that ``az.loo`` / ``az.waic`` estimate leave-one-out of those points; out-of-sample inputs go
  to ``predictions`` (draws at the new inputs) and ``predictions_constant_data`` (the inputs).
* Every file says how its draws were made in the ``sampling`` attribute (:func:`iid_attrs`,
  :func:`mcmc_attrs`, :data:`POINT_ESTIMATE`). Exact, variational and filtered Gaussian
  posteriors give **independent** draws: they are split into several chains
  (:func:`default_chains`, :func:`split_chains`) so that ArviZ's shape checks pass; their
  r_hat (about 1) and ESS (about the number of draws) check the draws, not a sampler. Gibbs
  chains (GP-Tree, LSM, OVE) are real chains with ``sample_stats``: their r_hat and ESS are
  the convergence diagnostics.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from models.linalg_numpy import JitterWarning, jitter_cholesky

from ppl_cl.batch import as_numpy
from ppl_cl.predictive import GaussianPredictive
from ppl_cl.seeding import as_generator

__all__ = [
    "SAMPLE_GROUPS",
    "DATA_GROUPS",
    "FILTERING_GROUP",
    "JitterWarning",
    "from_nested_dict",
    "samples_to_inference_data",
    "gaussian_draws",
    "gaussian_to_inference_data",
    "gaussian_log_likelihood",
    "pointwise_log_likelihood",
    "trajectories_to_dataset",
    "default_chains",
    "split_chains",
    "iid_attrs",
    "mcmc_attrs",
    "POINT_ESTIMATE",
]

_POSTERIOR_FAMILY = ("posterior", "posterior_predictive", "predictions", "sample_stats",
                     "log_likelihood")
_PRIOR_FAMILY = ("prior", "prior_predictive", "sample_stats_prior")
SAMPLE_GROUPS: tuple[str, ...] = _POSTERIOR_FAMILY + _PRIOR_FAMILY
"""Groups whose variables carry leading ``(chain, draw)`` axes."""
DATA_GROUPS: tuple[str, ...] = ("observed_data", "constant_data", "predictions_constant_data")
"""Groups without sample axes."""
FILTERING_GROUP = "filtering"
"""Custom group holding trajectories over time (dimension ``time``)."""


# -- array and argument checks --------------------------------------------------------------
def _to_numpy(value: Any, where: str) -> np.ndarray:
    try:
        arr = np.asarray(as_numpy(value))
    except Exception as exc:  # pragma: no cover - odd inputs
        raise TypeError(f"{where}: expected an array, received {type(value).__name__}") from exc
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"{where}: expected a numeric array, received dtype {arr.dtype}")
    return arr


def _check_dims_coords(dims: Any,
                       coords: Any) -> tuple[dict[str, list[str]], dict[str, np.ndarray]]:
    dims_out: dict[str, list[str]] = {}
    if dims is not None:
        if not isinstance(dims, Mapping):
            raise TypeError(f"dims: expected a dict {{variable: [dim names]}}, received "
                            f"{type(dims).__name__}")
        for var, names in dims.items():
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise TypeError(f"dims[{var!r}]: expected a list of dimension names, received "
                                f"{names!r}")
            dims_out[var] = list(names)
    coords_out: dict[str, np.ndarray] = {}
    if coords is not None:
        if not isinstance(coords, Mapping):
            raise TypeError(f"coords: expected a dict {{dim: values}}, received "
                            f"{type(coords).__name__}")
        for dim, values in coords.items():
            c = np.asarray(as_numpy(values))
            if c.ndim != 1:
                raise ValueError(f"coords[{dim!r}]: expected a 1-D array of labels, received "
                                 f"shape {c.shape}")
            coords_out[dim] = c
    return dims_out, coords_out


def _check_event_dims(where: str, var: str, event_shape: tuple[int, ...],
                      dims: dict[str, list[str]], coords: dict[str, np.ndarray]) -> None:
    """``dims[var]`` must name every non-sample axis; coords must have the axis lengths."""
    if var not in dims:
        return
    names = dims[var]
    if len(names) != len(event_shape):
        raise ValueError(f"dims[{var!r}] = {names}: expected {len(event_shape)} name(s) for the "
                         f"non-sample axes of {where} (shape {event_shape}), received "
                         f"{len(names)}")
    for name, size in zip(names, event_shape):
        if name in coords and coords[name].shape[0] != size:
            raise ValueError(f"coords[{name!r}]: expected {size} labels (axis {name!r} of "
                             f"{where}), received {coords[name].shape[0]}")


def _check_attrs(attrs: Any) -> dict[str, Any]:
    if attrs is None:
        return {}
    if not isinstance(attrs, Mapping):
        raise TypeError(f"attrs: expected a dict, received {type(attrs).__name__}")
    for key, value in attrs.items():
        ok = isinstance(value, (str, numbers.Number)) and not isinstance(value, bool)
        if not ok and isinstance(value, (list, tuple, np.ndarray)):
            ok = np.asarray(value).dtype.kind in "iuf"
        if not isinstance(key, str) or not ok:
            raise TypeError(f"attrs[{key!r}]: expected a str, int, float or numeric list "
                            f"(storable in netCDF), received {type(value).__name__}")
    return dict(attrs)


class _SampleShapes:
    """Remembers ``(chain, draw)`` per family so that mismatches name both variables."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[tuple[int, int], str]] = {}

    def check(self, group: str, where: str, chain_draw: tuple[int, int]) -> None:
        family = "posterior" if group in _POSTERIOR_FAMILY else "prior"
        if family not in self.seen:
            self.seen[family] = (chain_draw, where)
            return
        expected, first = self.seen[family]
        if chain_draw != expected:
            raise ValueError(f"{where}: expected (chain, draw) = {expected} as {first} (one "
                             f"set of draws per {family} family), received {chain_draw}")


def _check_dataset_group(group: str, dataset: Any, shapes: _SampleShapes) -> None:
    if group not in SAMPLE_GROUPS:
        return
    for var, da in dataset.data_vars.items():
        where = f"{group}[{var!r}]"
        if tuple(da.dims[:2]) != ("chain", "draw"):
            raise ValueError(f"{where}: expected leading dimensions ('chain', 'draw'), received "
                             f"{tuple(da.dims)}")
        shapes.check(group, where, (int(da.shape[0]), int(da.shape[1])))


# -- how the draws were made ------------------------------------------------------------------
def default_chains(num_draws: int) -> int:
    """The chains that ``num_draws`` independent draws are split into: the largest of 4, 3, 2
    that divides ``num_draws`` into chains of at least 4 draws (what ArviZ's r_hat and ESS
    need), else 1."""
    for c in (4, 3, 2):
        if num_draws % c == 0 and num_draws // c >= 4:
            return c
    return 1


def _check_chains(num_draws: int, num_chains: int | None) -> int:
    if not isinstance(num_draws, (int, np.integer)) or isinstance(num_draws, bool) \
            or num_draws < 1:
        raise ValueError(f"num_draws: expected an int >= 1, received {num_draws!r}")
    if num_chains is None:
        return default_chains(int(num_draws))
    if not isinstance(num_chains, (int, np.integer)) or isinstance(num_chains, bool) \
            or num_chains < 1:
        raise ValueError(f"num_chains: expected an int >= 1, received {num_chains!r}")
    if num_draws % num_chains:
        raise ValueError(f"num_draws = {num_draws}: expected a multiple of num_chains = "
                         f"{num_chains} (the draws are split into equal chains)")
    return int(num_chains)


def split_chains(draws: Mapping[str, Any], num_chains: int | None = None
                 ) -> dict[str, np.ndarray]:
    """Independent draws ``{name: (1, S, ...)}`` (one chain) as ``(num_chains, S /
    num_chains, ...)``, in order (default :func:`default_chains` of ``S``). Only for draws that
    are independent: splitting one Markov chain would fake its diagnostics."""
    out: dict[str, np.ndarray] = {}
    for name, value in draws.items():
        arr = _to_numpy(value, f"draws[{name!r}]")
        if arr.ndim < 2 or arr.shape[0] != 1:
            raise ValueError(f"draws[{name!r}]: expected shape (1, draws, ...), received "
                             f"{arr.shape}")
        c = _check_chains(int(arr.shape[1]), num_chains)
        out[name] = arr.reshape((c, arr.shape[1] // c) + arr.shape[2:])
    return out


def iid_attrs(posterior: str) -> dict[str, str]:
    """The attributes of a file of independent draws from ``posterior`` (e.g. ``"exact
    Gaussian posterior of GP regression"``)."""
    return {"sampling": "independent draws", "posterior": posterior,
            "chains": "independent draws split into chains: r_hat near 1 and ESS near the "
                      "number of draws are expected (they check the draws, not a sampler)"}


def mcmc_attrs(sampler: str, chains: str = "r_hat and ESS diagnose the sampler"
               ) -> dict[str, str]:
    """The attributes of a file of Markov chains from ``sampler`` (e.g. ``"Polya-Gamma block
    Gibbs"``); ``chains`` says how they start and what was kept."""
    return {"sampling": "markov chains", "posterior": sampler, "chains": chains}


POINT_ESTIMATE = {"sampling": "point estimate",
                  "chains": "one draw: no posterior, no diagnostics"}
"""The attributes of a file holding a point estimate as its single draw."""


def _arviz_major(az: Any) -> int:
    return int(str(az.__version__).split(".")[0])


def _from_dict_v0(from_dict: Callable, arrays: dict, datasets: dict, dims: dict,
                  coords: dict) -> Any:
    """ArviZ 0.x: groups as keyword arguments, custom / Dataset groups via ``add_groups``."""
    idata = from_dict(**arrays, dims=dims or None, coords=coords or None)
    if datasets:
        idata.add_groups(datasets)
    return idata


def _from_dict_v1(from_dict: Callable, arrays: dict, datasets: dict, dims: dict,
                  coords: dict) -> Any:
    """ArviZ 1.x: the nested dict; Dataset groups become children of the ``DataTree``."""
    tree = from_dict(arrays, dims=dims or None, coords=coords or None)
    for group, dataset in datasets.items():
        tree[group] = dataset
    return tree


def _group_names(idata: Any) -> list[str]:
    if hasattr(idata, "groups") and callable(idata.groups):
        names = idata.groups()
        return [n.strip("/") for n in names if n.strip("/")]
    return list(idata.children)  # xarray.DataTree (ArviZ 1.x): .groups is a tuple


# -- the entry point -----------------------------------------------------------------------
def from_nested_dict(groups: Mapping[str, Any], *, dims: Mapping[str, list[str]] | None = None,
                     coords: Mapping[str, Any] | None = None,
                     attrs: Mapping[str, Any] | None = None):
    """Build ArviZ ``InferenceData`` (0.x) / ``DataTree`` (1.x) from nested groups.

    Args:
        groups: ``{group: {variable: array}}``. Sample groups (:data:`SAMPLE_GROUPS`) need
            arrays of shape ``(chains, draws, ...)``, one ``(chains, draws)`` per family
            (posterior family / prior family); data groups (:data:`DATA_GROUPS`) take arrays
            of any shape. A group may instead be an ``xarray.Dataset`` (attached as is; the only
            way to add a custom group such as :data:`FILTERING_GROUP`). ``None`` or empty
            groups are skipped.
        dims: ``{variable: [dim names of the non-sample axes]}`` (all of them when given).
        coords: ``{dim: labels}``; lengths must match the axes they label.
        attrs: attributes (str / numbers) set on every group and on the root.

    Raises:
        ValueError / TypeError naming the group, variable, expected and received shape.
    """
    import xarray as xr

    if not isinstance(groups, Mapping):
        raise TypeError(f"groups: expected a dict {{group: {{variable: array}}}}, received "
                        f"{type(groups).__name__}")
    dims_d, coords_d = _check_dims_coords(dims, coords)
    attrs_d = _check_attrs(attrs)
    shapes = _SampleShapes()
    arrays: dict[str, dict[str, np.ndarray]] = {}
    datasets: dict[str, Any] = {}
    for group, content in groups.items():
        if content is None:
            continue
        if isinstance(content, xr.Dataset):
            _check_dataset_group(group, content, shapes)
            datasets[group] = content
            continue
        if group not in SAMPLE_GROUPS and group not in DATA_GROUPS:
            raise ValueError(f"groups: unknown group {group!r} given as a dict; known groups are "
                             f"{SAMPLE_GROUPS + DATA_GROUPS}; a custom group must be an "
                             f"xarray.Dataset (see trajectories_to_dataset)")
        if not isinstance(content, Mapping):
            raise TypeError(f"groups[{group!r}]: expected a dict {{variable: array}} or an "
                            f"xarray.Dataset, received {type(content).__name__}")
        converted: dict[str, np.ndarray] = {}
        for var, value in content.items():
            where = f"{group}[{var!r}]"
            arr = _to_numpy(value, where)
            if group in SAMPLE_GROUPS:
                if arr.ndim < 2:
                    raise ValueError(f"{where}: expected leading (chain, draw) axes, shape "
                                     f"(chains, draws, ...), received {arr.shape}; a single "
                                     f"chain of draws is x[None]")
                shapes.check(group, where, (int(arr.shape[0]), int(arr.shape[1])))
                event_shape = tuple(arr.shape[2:])
            else:
                event_shape = tuple(arr.shape)
            _check_event_dims(where, var, event_shape, dims_d, coords_d)
            converted[var] = arr
        if converted:
            arrays[group] = converted
    if not arrays and not datasets:
        raise ValueError("groups: expected at least one non-empty group, received none")

    import arviz as az

    build = _from_dict_v1 if _arviz_major(az) >= 1 else _from_dict_v0
    idata = build(az.from_dict, arrays, datasets, dims_d, coords_d)
    if attrs_d:
        for group in _group_names(idata):
            idata[group].attrs.update(attrs_d)
        idata.attrs = {**(idata.attrs or {}), **attrs_d}
    return idata


def samples_to_inference_data(samples: Mapping[str, Any], *,
                              dims: Mapping[str, list[str]] | None = None,
                              coords: Mapping[str, Any] | None = None,
                              log_likelihood: Mapping[str, Any] | Any | None = None,
                              observed_data: Mapping[str, Any] | None = None,
                              constant_data: Mapping[str, Any] | None = None,
                              sample_stats: Mapping[str, Any] | None = None,
                              trajectories: Mapping[str, Any] | Any | None = None,
                              predictions: Mapping[str, Any] | Any | None = None,
                              predictions_constant_data: Mapping[str, Any] | Any | None = None,
                              attrs: Mapping[str, Any] | None = None):
    """InferenceData of posterior draws (MCMC chains, Gibbs sweeps, draws of a Gaussian).

    Args:
        samples: ``{name: (chains, draws, ...)}`` — the ``posterior`` group.
        dims, coords, attrs: as in :func:`from_nested_dict`.
        log_likelihood: ``{name: (chains, draws, n)}`` or the Dataset of
            :func:`pointwise_log_likelihood` (for ``az.loo`` / ``az.waic``).
        observed_data, constant_data: ``{name: array}`` without sample axes.
        sample_stats: ``{name: (chains, draws, ...)}`` (e.g. ``lp``, acceptance).
        trajectories: ``{name: (T, ...)}`` or a Dataset of :func:`trajectories_to_dataset`,
            stored in the :data:`FILTERING_GROUP` group; a mapping uses ``dims`` / ``coords``
            (``coords["time"]`` labels the time axis).
        predictions: ``{name: (chains, draws, ...)}`` or a Dataset: draws at out-of-sample
            inputs (a Dataset when its variables share names, not dims, with the posterior's).
        predictions_constant_data: ``{name: array}`` or a Dataset: those inputs.
    """
    if not isinstance(samples, Mapping) or not samples:
        raise ValueError("samples: expected a non-empty dict {name: (chains, draws, ...)}")
    groups: dict[str, Any] = {"posterior": samples, "log_likelihood": log_likelihood,
                              "sample_stats": sample_stats, "observed_data": observed_data,
                              "constant_data": constant_data, "predictions": predictions,
                              "predictions_constant_data": predictions_constant_data}
    if trajectories is not None:
        import xarray as xr

        # an xarray.Dataset is itself a Mapping: keep it as built (with its time coordinate)
        if isinstance(trajectories, Mapping) and not isinstance(trajectories, xr.Dataset):
            trajectories = trajectories_to_dataset(trajectories, dims=dims, coords=coords)
        groups[FILTERING_GROUP] = trajectories
    return from_nested_dict(groups, dims=dims, coords=coords, attrs=attrs)


# -- Gaussian posteriors -----------------------------------------------------------------------
def _checked_covariance(name: str, mu: np.ndarray, S_in: Any) -> tuple[str, np.ndarray]:
    """``(layout, symmetrized covariance)`` of variable ``name`` for :func:`gaussian_draws`:
    ``"rows"`` (one covariance per row of the last axis) or ``"joint"`` (over the flattened
    mean); a ``ValueError`` for a shape, a non-finite value or an asymmetry it cannot take."""
    S_in = _to_numpy(S_in, f"covariance[{name!r}]")
    # symmetry is checked to the input's precision (a float32 covariance from a GPU learner
    # is symmetric to ~1e-7 only), then enforced exactly
    in_dtype = S_in.dtype if np.issubdtype(S_in.dtype, np.floating) else np.float64
    sym_tol = math.sqrt(np.finfo(in_dtype).eps)
    S = S_in.astype(np.float64)
    M = mu.size
    D = mu.shape[-1] if mu.ndim else 1
    batch = mu.shape[:-1] if mu.ndim else ()
    if S.ndim >= 2 and S.shape[-2:] == (D, D) and _broadcastable(S.shape[:-2], batch):
        kind = "rows"
    elif S.shape == (M, M):
        kind = "joint"
    else:
        raise ValueError(f"covariance[{name!r}]: expected shape ({M}, {M}) (joint over the "
                         f"flattened mean of shape {mu.shape}) or broadcastable to "
                         f"{batch + (D, D)} (one covariance per row of the last axis), "
                         f"received {S.shape}")
    if not np.isfinite(S).all():
        raise ValueError(f"covariance[{name!r}]: expected finite values, received NaN or inf")
    asym = np.abs(S - np.swapaxes(S, -1, -2)).max(initial=0.0)
    if asym > sym_tol * max(np.abs(S).max(initial=0.0), 1e-300):
        raise ValueError(f"covariance[{name!r}]: expected a symmetric matrix (to "
                         f"{sym_tol:.1g} x max |S|), received max |S - S^T| = {asym:.3g}")
    return kind, 0.5 * (S + np.swapaxes(S, -1, -2))


def _draw(name: str, mu: np.ndarray, kind: str, C: np.ndarray, eps: np.ndarray,
          warn_jitter: bool) -> np.ndarray:
    """``mu + (the factor of C) eps``, for each layout of :func:`gaussian_draws`."""
    num_draws = eps.shape[0]
    if kind == "variance":
        return mu + np.sqrt(C) * eps
    L = jitter_cholesky(C, name=f"covariance[{name!r}]", warn=warn_jitter)
    if kind == "joint":
        return mu + (eps.reshape(num_draws, -1) @ L.T).reshape((num_draws,) + mu.shape)
    if mu.ndim == 0:
        return mu + L[0, 0] * eps
    return mu + np.einsum("...ij,s...j->s...i", L, eps)


def gaussian_draws(mean: Mapping[str, Any], covariance: Mapping[str, Any] | None = None, *,
                   variance: Mapping[str, Any] | None = None, num_draws: int = 1000,
                   num_chains: int | None = 1, seed: int | np.random.Generator = 0,
                   warn_jitter: bool = True) -> dict[str, np.ndarray]:
    """Independent draws from Gaussian posteriors: ``{name: (num_chains, num_draws /
    num_chains, *mean.shape)}`` (``num_chains=None``: :func:`default_chains`).

    For each variable ``x`` with mean ``mu`` (shape ``s``, size ``M``, last axis ``D``) exactly
    one of the following gives its covariance:

    * ``variance[name]`` of shape ``s`` — independent entries: ``x = mu + sqrt(v) * eps``;
    * ``covariance[name]`` of shape ``(M, M)`` — joint over the flattened vector:
      ``vec(x) = vec(mu) + L eps`` with ``L L^T = Sigma``;
    * ``covariance[name]`` broadcastable to ``s[:-1] + (D, D)`` — independent Gaussian rows of
      the last axis, each ``x[..., :] = mu[..., :] + L[...] eps`` (e.g. the Kalman classifier's
      ``K`` readout columns sharing one covariance ``A: (m, m)``, exported as ``M^T: (K, m)``).

    The two covariance layouts coincide when they are the same matrix (``M == D``).
    ``eps ~ N(0, I)`` comes from one ``numpy.random.Generator(seed)``, variables in the order
    of ``mean``: same seed, same draws.

    Args:
        mean: ``{name: array}``.
        covariance: ``{name: Sigma}`` (symmetric PSD to the input's precision, i.e.
            ``max|S - S^T| <= sqrt(eps) max|S|``; symmetrized, jitter if needed).
        variance: ``{name: v}`` with ``v >= 0``.
        num_draws: draws per variable in all (``>= 1``).
        num_chains: the chains they are split into, in order (a divisor of ``num_draws``;
            ``None``: :func:`default_chains`). The draws themselves do not depend on it.
        seed: int or Generator.
        warn_jitter: warn (:class:`JitterWarning`) when a covariance needs jitter; ``False``
            for covariances singular to rounding by construction (a GP posterior at many
            inputs: the jitter, at most 1e-6 x its mean diagonal, is expected).
    """
    if not isinstance(mean, Mapping) or not mean:
        raise ValueError("mean: expected a non-empty dict {name: array}")
    covariance = dict(covariance or {})
    variance = dict(variance or {})
    for name in list(covariance) + list(variance):
        if name not in mean:
            raise ValueError(f"covariance/variance: {name!r} has no entry in mean "
                             f"(names in mean: {list(mean)})")
    chains = _check_chains(num_draws, num_chains)
    # Check everything before drawing (clear errors before any work).
    plan: list[tuple[str, np.ndarray, str, np.ndarray]] = []
    for name, mu_in in mean.items():
        mu = _to_numpy(mu_in, f"mean[{name!r}]").astype(np.float64)
        if not np.isfinite(mu).all():
            raise ValueError(f"mean[{name!r}]: expected finite values, received NaN or inf")
        if (name in covariance) == (name in variance):
            raise ValueError(f"{name!r}: expected exactly one of covariance[{name!r}] or "
                             f"variance[{name!r}], received "
                             f"{'both' if name in covariance else 'neither'}")
        if name in variance:
            v = _to_numpy(variance[name], f"variance[{name!r}]").astype(np.float64)
            if v.shape != mu.shape:
                raise ValueError(f"variance[{name!r}]: expected shape {mu.shape} (as the mean), "
                                 f"received {v.shape}")
            if not np.isfinite(v).all() or (v < 0).any():
                raise ValueError(f"variance[{name!r}]: expected finite values >= 0")
            plan.append((name, mu, "variance", v))
            continue
        plan.append((name, mu, *_checked_covariance(name, mu, covariance[name])))

    rng = as_generator(seed)
    draws: dict[str, np.ndarray] = {}
    for name, mu, kind, C in plan:
        x = _draw(name, mu, kind, C, rng.standard_normal((num_draws,) + mu.shape), warn_jitter)
        draws[name] = x.reshape((chains, num_draws // chains) + mu.shape)
    return draws


def _broadcastable(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], target[::-1]))


def gaussian_to_inference_data(mean: Mapping[str, Any], covariance: Mapping[str, Any] | None = None,
                               *, variance: Mapping[str, Any] | None = None,
                               num_draws: int = 1000, num_chains: int | None = None,
                               seed: int | np.random.Generator = 0,
                               dims: Mapping[str, list[str]] | None = None,
                               coords: Mapping[str, Any] | None = None,
                               log_likelihood: Mapping[str, Any] | Callable | Any | None = None,
                               observed_data: Mapping[str, Any] | None = None,
                               constant_data: Mapping[str, Any] | None = None,
                               sample_stats: Mapping[str, Any] | None = None,
                               trajectories: Mapping[str, Any] | Any | None = None,
                               predictions: Mapping[str, Any] | Callable | Any | None = None,
                               predictions_constant_data: Mapping[str, Any] | Any | None = None,
                               posterior: str = "Gaussian posterior", warn_jitter: bool = True,
                               attrs: Mapping[str, Any] | None = None):
    """InferenceData of ``num_draws`` independent draws from Gaussian posteriors, split into
    ``num_chains`` chains (default :func:`default_chains`), with :func:`iid_attrs` of
    ``posterior`` (what the Gaussian is) added to ``attrs``.

    For learners whose posterior is Gaussian: Kalman readout weights, GP inducing values, exact
    GP latent ``f``. See :func:`gaussian_draws` for ``mean`` / ``covariance`` / ``variance``.

    Args:
        log_likelihood: a dict / Dataset as in :func:`samples_to_inference_data`, or a callable
            ``draws -> {name: (1, num_draws, n)}`` evaluated on the draws (e.g. with
            :func:`gaussian_log_likelihood`), so that ``az.loo`` sees the same draws.
        predictions: as in :func:`samples_to_inference_data`, or a callable of the draws.
        posterior: what the Gaussian is (the ``posterior`` attribute).
        warn_jitter: as in :func:`gaussian_draws`.
        others: as in :func:`samples_to_inference_data`.

    Example (exact GP latent ``f`` at the training inputs, Gaussian noise ``s2``)::

        gaussian_to_inference_data(
            {"f": m}, {"f": K_post}, num_draws=500, seed=0,
            log_likelihood=lambda d: {"y": gaussian_log_likelihood(d["f"], y, s2)},
            observed_data={"y": y}, dims={"f": ["obs"], "y": ["obs"]})
    """
    draws = gaussian_draws(mean, covariance, variance=variance, num_draws=num_draws,
                           num_chains=num_chains, seed=seed, warn_jitter=warn_jitter)
    if callable(log_likelihood):
        log_likelihood = log_likelihood(draws)
    if callable(predictions):
        predictions = predictions(draws)
    return samples_to_inference_data(draws, dims=dims, coords=coords,
                                     log_likelihood=log_likelihood, observed_data=observed_data,
                                     constant_data=constant_data, sample_stats=sample_stats,
                                     trajectories=trajectories, predictions=predictions,
                                     predictions_constant_data=predictions_constant_data,
                                     attrs={**iid_attrs(posterior), **dict(attrs or {})})


# -- log-likelihood and trajectories -----------------------------------------------------------
def gaussian_log_likelihood(f_draws: Any, y: Any, noise_variance: Any) -> np.ndarray:
    """Pointwise ``log N(y_i | f_i^{(c,s)}, sigma^2)`` for every draw.

    Args:
        f_draws: ``(chains, draws, n)`` latent function draws.
        y: ``(n,)`` targets.
        noise_variance: ``sigma^2 > 0``, a scalar or broadcastable to ``f_draws``.

    Returns:
        ``(chains, draws, n)``; the density is :meth:`GaussianPredictive.log_prob`.
    """
    f = _to_numpy(f_draws, "f_draws").astype(np.float64)
    yv = _to_numpy(y, "y").astype(np.float64)
    if f.ndim != 3 or yv.ndim != 1 or f.shape[2] != yv.shape[0]:
        raise ValueError(f"f_draws, y: expected shapes (chains, draws, n) and (n,), received "
                         f"{f.shape} and {yv.shape}")
    s2 = _to_numpy(noise_variance, "noise_variance").astype(np.float64)
    try:
        s2 = np.broadcast_to(s2, f.shape)
    except ValueError as exc:
        raise ValueError(f"noise_variance: expected a scalar or shape broadcastable to "
                         f"{f.shape}, received {s2.shape}") from exc
    if not np.isfinite(s2).all() or (s2 <= 0).any():
        raise ValueError("noise_variance: expected finite values > 0")
    flat = GaussianPredictive(f.reshape(-1), s2.reshape(-1))
    return flat.log_prob(np.broadcast_to(yv, f.shape).reshape(-1)).reshape(f.shape)


def pointwise_log_likelihood(log_density: Any, *, var_name: str = "y", obs_dim: str = "obs",
                             obs_coords: Any = None):
    """The ``log_likelihood`` group for ``az.loo`` / ``az.waic``: an ``xarray.Dataset`` with one
    variable ``var_name`` of dims ``(chain, draw, obs_dim)``.

    Args:
        log_density: ``(chains, draws, n)`` — ``log p(y_i | theta^{(c,s)})`` per draw and
            point (``(draws, n)`` is read as one chain).
        var_name: name of the observed variable (matching ``observed_data``).
        obs_dim: name of the pointwise dimension.
        obs_coords: ``(n,)`` labels of the points (default ``0..n-1``).
    """
    import xarray as xr

    ll = _to_numpy(log_density, "log_density").astype(np.float64)
    if ll.ndim == 2:
        ll = ll[None]
    if ll.ndim != 3:
        raise ValueError(f"log_density: expected shape (chains, draws, n) or (draws, n), "
                         f"received {ll.shape}")
    if np.isnan(ll).any() or np.isposinf(ll).any():
        raise ValueError("log_density: expected log densities without NaN or +inf")
    C, S, n = ll.shape
    labels = np.arange(n) if obs_coords is None else np.asarray(as_numpy(obs_coords))
    if labels.shape != (n,):
        raise ValueError(f"obs_coords: expected shape ({n},), received {labels.shape}")
    return xr.Dataset({var_name: (("chain", "draw", obs_dim), ll)},
                      coords={"chain": np.arange(C), "draw": np.arange(S), obs_dim: labels})


def trajectories_to_dataset(trajectories: Mapping[str, Any], *, time: Any = None,
                            time_dim: str = "time", dims: Mapping[str, list[str]] | None = None,
                            coords: Mapping[str, Any] | None = None,
                            attrs: Mapping[str, Any] | None = None):
    """An ``xarray.Dataset`` of trajectories over time for the :data:`FILTERING_GROUP` group.

    Args:
        trajectories: ``{name: (T, ...)}`` — e.g. ``gamma`` (Kalman forgetting coefficient
            ``gamma_n``), ``alpha`` (calibration ``alpha_n``), ``mean`` (filtered ``m_n``,
            ``(T, m)``), all with the same ``T``.
        time: ``(T,)`` labels of the time axis (e.g. the number of points seen); default
            ``coords[time_dim]`` if given, else ``0..T-1``.
        time_dim: name of the time dimension.
        dims: ``{name: [dims of the trailing axes]}`` (default ``{name}_dim_k``).
        coords: labels of trailing dims (entries for unused dims are ignored).
        attrs: dataset attributes (str / numbers).
    """
    import xarray as xr

    if not isinstance(trajectories, Mapping) or not trajectories:
        raise ValueError("trajectories: expected a non-empty dict {name: (T, ...)}")
    dims_d, coords_d = _check_dims_coords(dims, coords)
    attrs_d = _check_attrs(attrs)
    data_vars: dict[str, Any] = {}
    T: int | None = None
    first = ""
    used: set[str] = set()
    for name, value in trajectories.items():
        where = f"trajectories[{name!r}]"
        arr = _to_numpy(value, where)
        if arr.ndim < 1:
            raise ValueError(f"{where}: expected shape (T, ...) with a leading time axis, "
                             f"received a scalar")
        if T is None:
            T, first = int(arr.shape[0]), where
        elif arr.shape[0] != T:
            raise ValueError(f"{where}: expected {T} time steps (as {first}), received "
                             f"{arr.shape[0]}")
        _check_event_dims(where, name, tuple(arr.shape[1:]), dims_d, coords_d)
        names = dims_d.get(name, [f"{name}_dim_{k}" for k in range(arr.ndim - 1)])
        used.update(names)
        data_vars[name] = ((time_dim, *names), arr)
    if time is None:
        time = coords_d.get(time_dim, np.arange(T))
    time = np.asarray(as_numpy(time))
    if time.shape != (T,):
        raise ValueError(f"time: expected shape ({T},), received {time.shape}")
    ds_coords: dict[str, Any] = {time_dim: time}
    ds_coords.update({d: c for d, c in coords_d.items() if d in used})
    return xr.Dataset(data_vars, coords=ds_coords, attrs=attrs_d)

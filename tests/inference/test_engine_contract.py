"""The engine contract of ``inference/base.py``, checked on every engine of ``inference/``.

For each engine (a small problem each, the whole file in well under a minute):

* a FRESH engine instance, built with the same arguments, takes the same step from the state
  restored by a save-load round trip (pickle) as the instance that made it: the state is
  complete and the engine keeps nothing between calls;
* ``step`` does not modify its input state (every leaf compared with a deep copy taken before);
* the same ``rng`` gives the same step bit for bit, and, for an engine that draws, a different
  ``rng`` gives a different step;
* ``init`` takes ``rng`` first, and ``kind`` is ``"jax"`` or ``"host"``; a ``"jax"`` engine's
  step runs under ``jax.lax.scan`` and agrees with the unscanned step.

:data:`CASES` names every engine class of ``inference/``; :func:`test_every_engine_is_covered`
fails when a module of ``inference/`` gains a class with ``init`` and ``step`` that is not here.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import pickle
import pkgutil
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import inference
from inference.base import KINDS, Engine, is_state

D = torch.float64


class Case(NamedTuple):
    """``make()`` builds a fresh engine; ``init(engine)`` its state; ``batch``; ``rngs``: two
    different ``rng`` values; ``random``: the step depends on ``rng``; ``ignore``: Info fields
    that are not results (wall-clock timings)."""

    make: Callable[[], Any]
    init: Callable[[Any], Any]
    batch: Any
    rngs: tuple[Any, Any]
    random: bool
    ignore: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# small problems
# ---------------------------------------------------------------------------------------------
def _gram(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 2, generator=g, dtype=D)
    K = torch.exp(-0.5 * torch.cdist(X, X) ** 2) + 1e-3 * torch.eye(n, dtype=D)
    return K, torch.linalg.cholesky(K)


def _labels(n: int, classes: int) -> torch.Tensor:
    return torch.arange(n) % classes


def _svi() -> Case:
    import pyro
    import pyro.distributions as dist
    from torch.distributions import constraints

    from inference.svi import SVI

    def model(y, num_data=None):
        mu = pyro.sample("mu", dist.Normal(torch.zeros((), dtype=D), 1.0))
        with pyro.plate("data", num_data, subsample=torch.arange(len(y))):
            pyro.sample("y", dist.Normal(mu, 0.5), obs=y)

    def guide(y, num_data=None):
        loc = pyro.param("loc", torch.zeros((), dtype=D))
        scale = pyro.param("scale", torch.ones((), dtype=D), constraint=constraints.positive)
        pyro.sample("mu", dist.Normal(loc, scale))

    y = 0.3 + torch.randn(8, generator=torch.Generator().manual_seed(1), dtype=D)
    return Case(lambda: SVI(model, guide, model_kwargs={"num_data": 8}),
                lambda e: e.init(0, y), (y,), (1, 2), True)


def _pg_gibbs() -> Case:
    from inference.pg_gibbs import PGGibbs, pad_problems

    K1, L1 = _gram(5, 0)
    K2, L2 = _gram(3, 1)
    problem = pad_problems([K1, K2], [_labels(5, 2).to(D) - 0.5, _labels(3, 2).to(D) - 0.5],
                           [L1, L2])
    return Case(lambda: PGGibbs(num_chains=2), lambda e: e.init(0, problem), problem, (1, 2),
                True)


def _multiclass(cls, **kw) -> Case:
    from inference.pg_multiclass import MulticlassProblem

    K, L = _gram(6, 2)
    Y = torch.nn.functional.one_hot(_labels(6, 3), 3).to(D)
    problem = MulticlassProblem(K, L, Y)
    return Case(lambda: cls(**kw), lambda e: e.init(0, problem), problem, (1, 2), True)


def _lsm() -> Case:
    from inference.pg_multiclass import LSMGibbs

    return _multiclass(LSMGibbs, num_chains=2)


def _ove() -> Case:
    from inference.pg_multiclass import OVEGibbs

    return _multiclass(OVEGibbs, num_chains=2)


def _pg_vi() -> Case:
    from inference.pg_vi import PGVI, VIBatch

    K, _ = _gram(5, 3)
    batch = VIBatch(K[:3, :3], K[:3], torch.diagonal(K).clone(), _labels(5, 2).to(D) - 0.5,
                    torch.arange(5), 5)
    return Case(lambda: PGVI(0.5), lambda e: e.init(None, 5, 3), batch, (None, None), False)


def _kalman_params():
    from inference import kalman as kf
    from models.kalman import DriftPrior, SurrogateLikelihood

    return kf, kf.KalmanParams(DriftPrior(0.5), SurrogateLikelihood(1 / 3))


def _kalman() -> Case:
    kf, params = _kalman_params()
    options = kf.FilterOptions(likelihood="softmax", learning_rate=0.1, num_samples=4)
    rng = np.random.default_rng(4)
    batch = (jnp.asarray(rng.normal(size=(4, 3))), jnp.asarray([0, 1, 2, 1], jnp.int32))
    return Case(lambda: kf.KalmanFilter(params, options),
                lambda e: e.init(None, 3, 3, initial_forgetting=0.9), batch,
                (jax.random.PRNGKey(1), jax.random.PRNGKey(2)), True)


def _features(theta, x):
    return jnp.tanh(x @ theta["W"])


def _init_theta(key):
    return {"W": 0.5 * jax.random.normal(key, (2, 3), jnp.float64)}


def _kalman_finetune() -> Case:
    from inference.kalman_finetune import FinetuneOptions, KalmanFinetune

    kf, params = _kalman_params()
    options = FinetuneOptions(fine_tune=True, learn_calibration=True, optimizer="sgd",
                              learning_rate=0.01, backbone_scale=10.0, replay_capacity=4,
                              replay_size=2)
    filt = kf.FilterOptions(likelihood="softmax", learning_rate=0.1, num_samples=4)
    rng = np.random.default_rng(5)
    batch = (jnp.asarray(rng.normal(size=(3, 2))), jnp.asarray([0, 2, 1], jnp.int32))
    return Case(lambda: KalmanFinetune(_init_theta, _features, 3, 3, params, filt, options),
                lambda e: e.init(jax.random.PRNGKey(0), input_dim=2, dtype=jnp.float64), batch,
                (jax.random.PRNGKey(1), jax.random.PRNGKey(2)), True)


def _online_sgd() -> Case:
    from inference.online_sgd import OnlineSGD
    from inference.replay import replay_add

    rng = np.random.default_rng(6)
    batch = (jnp.asarray(rng.normal(size=(3, 2))), jnp.asarray([0, 2, 1], jnp.int32))

    def init(e):
        s = e.init(jax.random.PRNGKey(0), input_dim=2, dtype=jnp.float64)
        # a memory holding points, so that the replayed draw depends on rng
        return s._replace(memory=replay_add(s.memory, jnp.asarray(rng.normal(size=(4, 2))),
                                            jnp.asarray([1, 0, 2, 2], jnp.int32)))

    return Case(lambda: OnlineSGD(_init_theta, _features, 3, 3, 0.1, replay_capacity=6,
                                  replay_size=2), init, batch,
                (jax.random.PRNGKey(1), jax.random.PRNGKey(2)), True)


def _objective(params, x):
    return jnp.sum((jnp.log(params["a"]) - x) ** 2) + params["b"] ** 2


def _type2ml() -> Case:
    from inference.type2ml import Type2ML

    return Case(lambda: Type2ML(_objective, unconstrained={"a": False, "b": True}),
                lambda e: e.init(None, {"a": jnp.asarray([1.0, 2.0]), "b": jnp.asarray(0.5)}),
                (jnp.asarray([0.3, -0.2]),), (None, None), False)


def _gp_ella() -> Case:
    from inference.gp_ella import ELLAEngine

    rng = np.random.default_rng(7)
    R = rng.normal(size=(3, 3))
    batch = (rng.normal(size=3), R @ R.T + np.eye(3), 0)
    # rng only re-draws basis columns that no task uses: none here
    return Case(lambda: ELLAEngine(2, 0.1, 0.01), lambda e: e.init(jax.random.PRNGKey(0), 3),
                batch, (jax.random.PRNGKey(1), jax.random.PRNGKey(2)), False)


def _online_sgpr() -> Case:
    from inference.vips import FixedM, OnlineSGPREngine
    from models.exact_gp import GPRegressionParams
    from models.kernels_jax import SquaredExponential

    rng = np.random.default_rng(8)
    X = rng.uniform(-2, 2, size=(12, 1))
    batch = (X, np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=12))
    params = GPRegressionParams(SquaredExponential(jnp.asarray(1.0), jnp.asarray([0.6])),
                                jnp.asarray(0.05))
    return Case(lambda: OnlineSGPREngine(FixedM(4, "random"), fit=False),
                lambda e: e.init(None, params, 1), batch,
                (jax.random.PRNGKey(1), jax.random.PRNGKey(2)), True,
                ("select_seconds", "fit_seconds"))


def _gp_tree_sgd() -> Case:
    from inference.gp_tree_vi import CrossEntropyLoss, SGDEngine

    g = torch.Generator().manual_seed(9)
    params = {"backbone.weight": torch.randn(3, 2, generator=g, dtype=D),
              "backbone.bias": torch.randn(3, generator=g, dtype=D),
              "head.weight": torch.randn(2, 3, generator=g, dtype=D),
              "head.bias": torch.zeros(2, dtype=D)}
    batch = (torch.randn(6, 2, generator=g, dtype=D), _labels(6, 2))

    def make():
        # the modules give only the structure (functional_call takes every parameter from
        # the state), so the global generator their construction draws from is left untouched
        with torch.random.fork_rng(devices=[]):
            loss = CrossEntropyLoss(torch.nn.Linear(2, 3, dtype=D), torch.nn.Linear(3, 2, dtype=D))
        return SGDEngine(loss, ["backbone.weight", "backbone.bias", "head.weight"], 0.1,
                         momentum=0.9, weight_decay=1e-4, milestones=(1, 3), gamma=0.5)

    def init(e):
        # past the first milestone, with the momentum buffers started
        s = e.end_epoch(e.init(None, params))
        return e.step(None, s, batch)[0]

    return Case(make, init, batch, (None, None), False)


CASES: dict[str, Callable[[], Case]] = {
    "inference.svi.SVI": _svi,
    "inference.pg_gibbs.PGGibbs": _pg_gibbs,
    "inference.pg_multiclass.LSMGibbs": _lsm,
    "inference.pg_multiclass.OVEGibbs": _ove,
    "inference.pg_vi.PGVI": _pg_vi,
    "inference.kalman.KalmanFilter": _kalman,
    "inference.kalman_finetune.KalmanFinetune": _kalman_finetune,
    "inference.online_sgd.OnlineSGD": _online_sgd,
    "inference.type2ml.Type2ML": _type2ml,
    "inference.gp_ella.ELLAEngine": _gp_ella,
    "inference.vips.OnlineSGPREngine": _online_sgpr,
    "inference.gp_tree_vi.SGDEngine": _gp_tree_sgd,
}

# ---------------------------------------------------------------------------------------------
# comparing states
# ---------------------------------------------------------------------------------------------
def _leaves(tree: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return [x for f in tree._fields for x in _leaves(getattr(tree, f), f"{path}.{f}")]
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _leaves(tree[k], f"{path}[{k!r}]")]
    if isinstance(tree, (tuple, list)):
        return [x for i, v in enumerate(tree) for x in _leaves(v, f"{path}[{i}]")]
    if callable(getattr(tree, "tree_flatten", None)):              # a JAX pytree class
        return [x for i, v in enumerate(tree.tree_flatten()[0])
                for x in _leaves(v, f"{path}<{type(tree).__name__}>[{i}]")]
    return [(path, tree)]


def _array(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, jax.Array):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(x)
    return x


def assert_same(a: Any, b: Any, ignore: tuple[str, ...] = ()) -> None:
    """``a`` and ``b`` have the same structure and bitwise equal leaves (NaN equals NaN)."""
    la, lb = _leaves(a), _leaves(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    assert type(a) is type(b)
    for (path, x), (_, y) in zip(la, lb):
        if any(path.endswith(f".{name}") for name in ignore):
            continue
        x, y = _array(x), _array(y)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            assert x.dtype == y.dtype and x.shape == y.shape, path
            assert np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"), path
        else:
            assert type(x) is type(y) and (x == y or (x != x and y != y)), path


def differs(a: Any, b: Any) -> bool:
    """Some leaf of ``a`` differs from ``b``'s (same structure assumed)."""
    try:
        assert_same(a, b)
    except AssertionError:
        return True
    return False


# ---------------------------------------------------------------------------------------------
# the contract
# ---------------------------------------------------------------------------------------------
def _params():
    return [pytest.param(name, id=name.rsplit(".", 1)[1]) for name in CASES]


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    return {}


def _case(cases: dict, name: str) -> Case:
    if name not in cases:
        cases[name] = CASES[name]()
    return cases[name]


@pytest.mark.parametrize("name", _params())
def test_step_follows_the_contract(name, cases):
    case = _case(cases, name)
    engine = case.make()
    assert isinstance(engine, Engine)
    state = case.init(engine)
    assert is_state(state)
    saved = pickle.dumps(state)
    before = copy.deepcopy(state)
    rng, other = case.rngs

    new, info = engine.step(rng, state, case.batch)
    assert is_state(new) and is_state(info)
    # (b) the input state is not modified in place
    assert_same(state, before)
    # (c) the same rng gives the same step, bit for bit
    again, info_again = engine.step(rng, state, case.batch)
    assert_same(again, new)
    assert_same(info_again, info, case.ignore)
    # (a) a fresh instance on the restored state takes the same step
    fresh_new, fresh_info = case.make().step(rng, pickle.loads(saved), case.batch)
    assert_same(fresh_new, new)
    assert_same(fresh_info, info, case.ignore)
    if case.random:
        assert differs(engine.step(other, state, case.batch)[0], new)
    assert_same(state, before)


@pytest.mark.parametrize("name", _params())
def test_init_takes_rng_first_and_kind_is_named(name):
    module, cls_name = name.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), cls_name)
    assert getattr(cls, "kind", None) in KINDS
    first = list(inspect.signature(cls.init).parameters)[1]
    assert first == "rng", f"{name}.init's first argument is {first!r}"


def _jax_names() -> list:
    out = []
    for name in CASES:
        module, cls_name = name.rsplit(".", 1)
        if getattr(getattr(importlib.import_module(module), cls_name), "kind", None) == "jax":
            out.append(pytest.param(name, id=cls_name))
    return out


@pytest.mark.parametrize("name", _jax_names())
def test_jax_engines_step_under_scan(name, cases):
    case = _case(cases, name)
    engine = case.make()
    state = case.init(engine)
    keys = jnp.stack(case.rngs)

    def body(s, key):
        return engine.step(key, s, case.batch)

    final, infos = jax.lax.scan(body, state, keys)
    s1, _ = engine.step(case.rngs[0], state, case.batch)
    s2, _ = engine.step(case.rngs[1], s1, case.batch)
    for (path, x), (_, y) in zip(_leaves(final), _leaves(s2)):
        np.testing.assert_allclose(_array(x), _array(y), rtol=1e-9, atol=1e-12, err_msg=path)
    assert jax.tree_util.tree_structure(final) == jax.tree_util.tree_structure(s2)


def _engine_classes() -> set[str]:
    found = set()
    for mod in pkgutil.iter_modules(inference.__path__):
        module = importlib.import_module(f"inference.{mod.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ != module.__name__ or getattr(obj, "_is_protocol", False):
                continue
            if callable(getattr(obj, "init", None)) and callable(getattr(obj, "step", None)):
                found.add(f"{obj.__module__}.{obj.__qualname__}")
    return found


def test_every_engine_is_covered():
    """A new engine class of ``inference/`` (a class with ``init`` and ``step``) must be added to
    :data:`CASES`."""
    assert _engine_classes() == set(CASES)


TORCH_ENGINES = ["inference.svi.SVI", "inference.pg_gibbs.PGGibbs",
                 "inference.pg_multiclass.LSMGibbs", "inference.pg_multiclass.OVEGibbs"]


@pytest.mark.parametrize("name", [pytest.param(n, id=n.rsplit(".", 1)[1]) for n in TORCH_ENGINES])
def test_torch_engines_carry_their_generator_and_refuse_a_live_one(name, cases):
    """``step(None, ...)`` continues from the state's generator (the same as passing that
    state as ``rng``); an int seed and its generator state start the same; a live
    ``torch.Generator`` is refused."""
    from inference.base import torch_generator_state

    case = _case(cases, name)
    engine = case.make()
    state = case.init(engine)
    a, _ = engine.step(None, state, case.batch)
    b, _ = engine.step(state.rng_state, state, case.batch)
    assert_same(a, b)
    assert_same(engine.step(3, state, case.batch)[0],
                engine.step(torch_generator_state(3), state, case.batch)[0])
    with pytest.raises(TypeError, match="live torch.Generator"):
        engine.step(torch.Generator().manual_seed(0), state, case.batch)

"""GP-Tree learner, class trees and the PG baselines on the learner protocol."""

import numpy as np
import pytest
import torch

from ppl_cl import Batch
from ppl_cl.configs.gp_tree import GPTreeConfig, LSMConfig, OVEConfig, SBMGPConfig
from ppl_cl.learners import load_learner
from ppl_cl.learners.gp_tree import GPTree, NotFittedError, SBMGP
from ppl_cl.learners.pg_baselines import LSMGibbsClassifier, OVEGibbsClassifier
from ppl_cl.trees import (chain_tree, class_probabilities, class_prototypes, join, kmeans_tree,
                          random_tree)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _blobs(n_per=25, seed=0, centres=None, spread=0.15):
    """Classes as Gaussian blobs around directions on the circle (the kernels see unit inputs):
    classes 0, 1 near angle 0 and 0.5; classes 2, 3 near pi and pi + 0.5; 4, 5 near pi/2 +- ."""
    rng = np.random.default_rng(seed)
    angles = centres if centres is not None else [0.0, 0.5, np.pi, np.pi + 0.5]
    xs, ys = [], []
    for c, a in enumerate(angles):
        xs.append(np.c_[np.cos(a), np.sin(a)] + spread * rng.normal(size=(n_per, 2)))
        ys.append(np.full(n_per, c))
    return np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def _small(**kw):
    base = dict(num_chains=8, num_steps=5, kmeans_n_init=5)
    base.update(kw)
    return GPTree(**base)


# -- trees ---------------------------------------------------------------------------------------
def test_tree_probabilities_sum_to_one():
    tree = random_tree(range(7), seed=3)
    g = torch.Generator().manual_seed(0)
    p = {i: torch.rand(50, dtype=torch.float64, generator=g) for i in tree.internal_nodes()}
    probs = class_probabilities(tree, p, 9, torch.zeros(1, dtype=torch.float64))
    np.testing.assert_allclose(probs.sum(1).numpy(), 1.0, atol=1e-12)
    assert float(probs[:, 7:].abs().max()) == 0.0           # classes outside the tree
    joined = join(tree, chain_tree([7, 8]))
    p2 = {i: torch.rand(50, dtype=torch.float64, generator=g) for i in joined.internal_nodes()}
    np.testing.assert_allclose(class_probabilities(joined, p2, 9, torch.zeros(1)).sum(1).numpy(),
                               1.0, atol=1e-6)


def test_kmeans_tree_puts_similar_classes_under_one_node():
    x, y = _blobs()
    protos = class_prototypes(x, y, [0, 1, 2, 3])
    tree = kmeans_tree(protos, [0, 1, 2, 3], n_init=10)
    root = tree.nodes[tree.root]
    sides = {tree.nodes[root.left].classes, tree.nodes[root.right].classes}
    assert {tuple(sorted(s)) for s in sides} == {(0, 1), (2, 3)}
    assert tree.depth() == 2 and len(tree.internal_nodes()) == 3


def test_random_and_chain_trees():
    t = random_tree(range(8), seed=0)
    assert t.depth() == 3 and sorted(t.classes) == list(range(8))
    c = chain_tree([3, 1, 2])
    assert c.depth() == 2 and c.nodes[c.nodes[c.root].left].classes == (3,)
    with pytest.raises(ValueError, match="no examples"):
        class_prototypes(np.zeros((3, 2)), np.array([0, 0, 1]), [0, 1, 2])


# -- GP-Tree, Gibbs ------------------------------------------------------------------------------
def test_gibbs_tree_learns_toy_and_probabilities_are_normalized():
    x, y = _blobs(seed=1)
    xt, yt = _blobs(seed=2)
    gp = _small()
    rec = gp.update(Batch(x, y))
    assert rec["nodes_fitted"] == 3 and rec["tree_depth"] == 2
    pred = gp.predict(xt)
    assert pred.probs.shape == (100, 4)
    np.testing.assert_allclose(pred.probs.sum(1), 1.0, atol=1e-9)
    assert pred.accuracy(yt) > 0.9
    mean_pred = _small(predict="mean")
    mean_pred.update(Batch(x, y))
    assert mean_pred.predict(xt).accuracy(yt) > 0.9


def test_protocol_errors_leave_state_unchanged():
    x, y = _blobs(seed=1)
    gp = _small()
    with pytest.raises(NotFittedError):
        gp.predict(x)
    with pytest.raises(TypeError, match="batch"):
        gp.update((x, y))
    with pytest.raises(ValueError, match="single class"):
        gp.update(Batch(x[y == 0], y[y == 0]))
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        gp.update(Batch(bad, y))
    with pytest.raises(ValueError, match=r"classes \[5\] have no examples"):
        gp.update(Batch(x, y), classes=[0, 1, 2, 3, 5])
    assert not gp.is_fitted
    gp.update(Batch(x, y))
    before = gp.predict(x).probs
    with pytest.raises(ValueError, match="learned in an earlier session"):
        gp.update(Batch(x[:10], y[:10]))
    with pytest.raises(ValueError, match=r"expected shape \(n, 2\)"):
        gp.update(Batch(np.zeros((4, 3)), np.array([7, 7, 8, 8])))
    with pytest.raises(ValueError, match="NaN"):
        gp.update(Batch(np.full((4, 2), np.nan), np.array([7, 7, 8, 8])))
    np.testing.assert_array_equal(gp.predict(x).probs, before)
    assert gp.seen_classes == (0, 1, 2, 3)
    # unknown labels at predict time: the predictive refuses them
    with pytest.raises(ValueError, match="labels in 0..3"):
        gp.predict(x[:2]).log_prob(np.array([0, 9]))
    assert gp.predict(np.zeros((0, 2))).probs.shape == (0, 4)


@pytest.mark.parametrize("variant", ["gptree", "session", "rebuild"])
def test_fscil_sessions_and_exact_resume(tmp_path, variant):
    centres = [0.0, 0.4, np.pi, np.pi + 0.4, np.pi / 2, np.pi / 2 + 0.4, -np.pi / 2, -np.pi / 2 + 0.4]
    x, y = _blobs(n_per=20, seed=3, centres=centres)
    xt, yt = _blobs(n_per=20, seed=4, centres=centres)
    base = np.isin(y, [0, 1, 2, 3])
    rng = np.random.default_rng(0)
    sessions = [np.concatenate([rng.choice(np.flatnonzero(y == c), 5, replace=False) for c in cs])
                for cs in ([4, 5], [6, 7])]
    a = _small(fscil_tree=variant)
    a.update(Batch(x[base], y[base]))
    a.update(Batch(x[sessions[0]], y[sessions[0]]))
    path = tmp_path / "gp.npz"
    a.save(path)
    b = load_learner(path)
    assert isinstance(b, GPTree) and b.config == a.config
    np.testing.assert_array_equal(b.predict(xt).probs, a.predict(xt).probs)
    ra = a.update(Batch(x[sessions[1]], y[sessions[1]]))
    rb = b.update(Batch(x[sessions[1]], y[sessions[1]]))
    assert ra["nodes_fitted"] == rb["nodes_fitted"]
    pa, pb = a.predict(xt), b.predict(xt)
    np.testing.assert_array_equal(pa.probs, pb.probs)
    assert pa.probs.shape == (160, 8)
    np.testing.assert_allclose(pa.probs.sum(1), 1.0, atol=1e-9)
    assert pa.accuracy(yt) > 0.7
    assert sorted(a.tree.classes) == list(range(8))
    expected_nodes = {"gptree": 3 + 3 + 1, "session": 3 + 1 + 1 + 1 + 1, "rebuild": 7}[variant]
    assert len(a.tree.internal_nodes()) == expected_nodes


# az.loo on a few dozen Gibbs draws may flag Pareto k: expected, not what is tested here
@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto:UserWarning")
def test_to_inference_data_has_chains_for_az_summary():
    import arviz as az

    x, y = _blobs(seed=1)
    gp = _small(num_chains=4, num_steps=6)
    gp.update(Batch(x, y))
    idata = gp.to_inference_data()
    root = gp.tree.root
    f = idata.posterior[f"f_node{root}"]
    assert f.dims == ("chain", "draw", f"obs_node{root}") and f.shape[:2] == (4, 6)
    summ = az.summary(idata, var_names=[f"f_node{root}"])
    assert "r_hat" in summ.columns and "ess_bulk" in summ.columns
    assert np.isfinite(summ["r_hat"].to_numpy()).all()
    assert f"log_marginal_node{root}" in idata.sample_stats
    assert idata.attrs["sampling"] == "markov chains"
    # with the training data: log p(y_n | f) per draw, the sum of log sigma(+-f_node(x_n))
    # along y_n's path (eq. 9), for az.loo / az.compare
    with_data = gp.to_inference_data(x=x, y=y)
    ll = with_data.log_likelihood["y"].values
    assert ll.shape == (4, 6, len(y)) and np.isfinite(ll).all() and (ll < 0).all()
    np.testing.assert_array_equal(with_data.observed_data["y"].values, y)
    expected = np.zeros_like(ll)
    for i in gp.tree.internal_nodes():
        on = np.isin(y, gp.tree.nodes[i].classes)
        node_x = gp.nodes[i]["X"].numpy()
        idx = [int(np.flatnonzero((node_x == row).all(1))[0]) for row in x[on]]
        f = gp.nodes[i]["f_trace"].numpy()[:, :, idx].transpose(1, 0, 2)
        sign = 2.0 * gp.tree.node_labels(i, y[on]) - 1.0
        expected[:, :, on] += -np.logaddexp(0.0, -sign * f)          # log sigma(sign f)
    np.testing.assert_allclose(ll, expected, rtol=1e-10, atol=1e-12)
    assert np.isfinite(az.loo(with_data).elpd_loo)
    with pytest.raises(ValueError, match="not a training point of node"):
        gp.to_inference_data(x=x + 1.0, y=y)


def test_sbm_gp_is_the_chain():
    x, y = _blobs(seed=1)
    sbm = SBMGP(num_chains=8, num_steps=5)
    sbm.update(Batch(x, y))
    assert sbm.config.tree == "chain" and sbm.tree.depth() == 3
    assert sbm.predict(x).accuracy(y) > 0.9
    with pytest.raises(ValueError, match="tree: SBM-GP"):
        SBMGPConfig(tree="kmeans")


# -- GP-Tree, VI and DKL ---------------------------------------------------------------------------
def test_vi_tree_on_features():
    x, y = _blobs(seed=1)
    xt, yt = _blobs(seed=2)
    gp = GPTree(inference="vi", epochs=15, pretrain_epochs=0, batch_size=32, natural_lr=0.3,
                kmeans_n_init=5)
    rec = gp.update(Batch(x, y))
    assert len(rec["gp_losses"]) == 15 and rec["gp_losses"][-1] < rec["gp_losses"][0]
    assert gp.predict(xt).accuracy(yt) > 0.9
    with pytest.raises(ValueError, match="no Gibbs node"):
        gp.to_inference_data()


def test_dkl_base_session_then_gibbs_novel_session_and_resume(tmp_path):
    centres = [0.0, 0.4, np.pi, np.pi + 0.4, np.pi / 2, np.pi / 2 + 0.4]
    x, y = _blobs(n_per=30, seed=5, centres=centres)
    xt, yt = _blobs(n_per=30, seed=6, centres=centres)
    base = y < 4
    gp = GPTree(inference="vi", backbone="mlp", hidden=(16,), embedding_dim=8, epochs=12,
                pretrain_epochs=4, milestones=(8,), batch_size=32, learning_rate=0.05,
                kmeans_n_init=5, num_chains=6, num_steps=4)
    rec = gp.update(Batch(x[base], y[base]))
    assert len(rec["pretrain_losses"]) == 4 and len(rec["gp_losses"]) == 8
    assert gp.predict(xt[yt < 4]).accuracy(yt[yt < 4]) > 0.8
    gp.save(tmp_path / "dkl.npz")
    other = GPTree.load(tmp_path / "dkl.npz")
    np.testing.assert_array_equal(other.embed(xt), gp.embed(xt))
    shots = np.concatenate([np.flatnonzero(y == c)[:5] for c in (4, 5)])
    gp.update(Batch(x[shots], y[shots]))
    other.update(Batch(x[shots], y[shots]))
    np.testing.assert_array_equal(gp.predict(xt).probs, other.predict(xt).probs)
    kinds = {gp.nodes[i]["kind"] for i in gp.tree.internal_nodes()}
    assert kinds == {"vi", "gibbs"}


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_chains"):
        GPTreeConfig(num_chains=0)
    with pytest.raises(ValueError, match="tree"):
        GPTreeConfig(tree="balanced")
    with pytest.raises(ValueError, match="backbone"):
        GPTreeConfig(backbone="mlp", inference="gibbs")
    with pytest.raises(ValueError, match="pretrain_epochs"):
        GPTreeConfig(epochs=5, pretrain_epochs=5)
    with pytest.raises(TypeError, match="unknown"):
        GPTree(chains=3)
    cfg = GPTreeConfig(milestones=[3, 4])
    assert cfg.milestones == (3, 4) and GPTree(cfg, seed=2).config.seed == 2


# -- LSM and OVE -------------------------------------------------------------------------------------
@pytest.mark.parametrize("klass", [LSMGibbsClassifier, OVEGibbsClassifier])
def test_multiclass_baselines(klass, tmp_path):
    x, y = _blobs(n_per=15, seed=1)
    xt, yt = _blobs(n_per=15, seed=2)
    m = klass(num_chains=4, num_steps=8)
    with pytest.raises(NotFittedError):
        m.predict(xt)
    rec = m.update(Batch(x, y))
    assert rec["num_classes"] == 4 and len(rec["train_log_likelihood"]) == 8
    pred = m.predict(xt)
    np.testing.assert_allclose(pred.probs.sum(1), 1.0, atol=1e-9)
    assert pred.accuracy(yt) > 0.85
    m.save(tmp_path / "m.npz")
    back = load_learner(tmp_path / "m.npz")
    np.testing.assert_array_equal(back.predict(xt).probs, pred.probs)
    with pytest.raises(ValueError, match=r"classes \[1\] have no examples"):
        klass(num_chains=2, num_steps=1).update(Batch(x[y != 1], y[y != 1]))
    with pytest.raises(ValueError, match="NaN"):
        m.update(Batch(np.full((2, 2), np.nan), np.array([0, 1])))
    np.testing.assert_array_equal(m.predict(xt).probs, pred.probs)
    assert m.to_inference_data().posterior["f"].shape == (4, 8, 4, 60)


@pytest.mark.parametrize("klass", [LSMGibbsClassifier, OVEGibbsClassifier])
def test_multiclass_baselines_export_the_likelihood_and_lp_of_every_sweep(klass):
    """log_likelihood.y holds log p(y_n | f_n) of the training labels per draw (LSM: sigma(f_y)
    / sum_c sigma(f_c); OVE: prod_{c != y} sigma(f_y - f_c)), sample_stats.lp adds
    sum_c log N(f_c | 0, K): checked against NumPy / SciPy on the exported draws."""
    from scipy.special import expit
    from scipy.stats import multivariate_normal

    from models.gp_tree import node_gram

    x, y = _blobs(n_per=6, seed=1)
    m = klass(num_chains=3, num_steps=5)
    m.update(Batch(x, y))
    idata = m.to_inference_data()
    assert idata.attrs["sampling"] == "markov chains"
    f = idata.posterior["f"].values                                        # (ch, S, C, n)
    ll = idata.log_likelihood["y"].values
    n = len(y)
    f_y = np.take_along_axis(f, np.broadcast_to(y, f.shape[:2] + (1, n)), axis=2)[:, :, 0]
    if klass is LSMGibbsClassifier:
        expected = np.log(expit(f_y) / expit(f).sum(2))
    else:
        expected = np.log(expit(f_y[:, :, None] - f)).sum(2) - np.log(0.5)
    np.testing.assert_allclose(ll, expected, rtol=1e-9)
    np.testing.assert_array_equal(idata.observed_data["y"].values, y)
    K = node_gram(m._params(), m.X).numpy()
    prior = multivariate_normal(np.zeros(n), K)
    log_prior = prior.logpdf(f.reshape(-1, n)).reshape(f.shape[:3]).sum(-1)
    np.testing.assert_allclose(idata.sample_stats["lp"].values, ll.sum(-1) + log_prior,
                               rtol=1e-8)
    np.testing.assert_allclose(idata.sample_stats["log_lik"].values, ll.sum(-1), rtol=1e-12)


def test_ove_refuses_too_large_joint():
    x, y = _blobs(n_per=15, seed=1)
    with pytest.raises(ValueError, match="max_joint_dim"):
        OVEGibbsClassifier(OVEConfig(max_joint_dim=100)).update(Batch(x, y))
    with pytest.raises(ValueError, match="num_chains"):
        LSMConfig(num_chains=0)


def test_baselines_predict_at_the_mean():
    x, y = _blobs(n_per=15, seed=1)
    for klass in (LSMGibbsClassifier, OVEGibbsClassifier):
        m = klass(num_chains=3, num_steps=6, predict="mean")
        m.update(Batch(x, y))
        p = m.predict(x)
        np.testing.assert_allclose(p.probs.sum(1), 1.0, atol=1e-9)
        assert p.accuracy(y) > 0.85

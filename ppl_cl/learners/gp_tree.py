"""GP-Tree learner (Achituve et al. 2021, ICML): a tree of Polya-Gamma GP classifiers, fitted by
block Gibbs or by natural-gradient PG-VI, with deep kernel learning and the few-shot
class-incremental protocol.

``update(batch)`` — the first call is the **base session**: it builds the class tree
(:mod:`ppl_cl.trees`) from the class prototypes of the batch's features, then fits every
internal node, by Gibbs (:class:`inference.pg_gibbs.PGGibbs`; nodes of a tree level in one
batched call) or by VI (:class:`inference.pg_vi.PGVI`, class-wise inducing inputs initialized
by k-means, kernel / inducing inputs / backbone by SGD on the per-node weighted negative ELBO,
App. C.2; with a backbone, cross-entropy pre-training first, Sect. 3.3). Every later call is a
**novel session** of new classes (Sect. 3.4): the backbone is frozen, novel examples are kept
as embeddings, and the tree grows by ``config.fscil_tree``:

* ``"gptree"`` — a new root over the base tree and a sub-tree of all novel classes so far;
* ``"session"`` — a new root over the current tree and a sub-tree of this session's classes;
* ``"rebuild"`` — the whole tree rebuilt over base exemplars and all novel embeddings;

and every new node is fitted by Gibbs with the fixed kernel of App. C.3. A root's data are the
exemplars of the classes on its left (the base classes' inducing inputs, or k-means centres of
their features when the base session was fitted by Gibbs) and the novel embeddings.

``predict(x)`` multiplies the node probabilities along the root-to-leaf paths (eq. 9); a
Gibbs node averages ``E[sigma(f*)]`` (eq. 12 + Gauss-Hermite, or ``sigma(E f*)``) over its
chains, a VI node uses eq. 14. The state (tree, node posteriors, inducing inputs, exemplars,
embeddings, backbone weights, generator state) is saved exactly; ``to_inference_data`` exports
the Gibbs chains of every node (``chain, draw`` dims, so ``az.summary`` gives r_hat and ESS).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from torch import nn

from inference.pg_gibbs import PGGibbs, pad_problems, unpad
from inference.pg_vi import PGVI, VIBatch, VIState
from models.backbones_torch import make_backbone
from models.gp_tree import (NaturalParams, NodeKernelParams, gibbs_predictive,
                            gibbs_predictive_cache, natural_to_moments, node_gram, node_kernel,
                            sigmoid_expectation, vi_predictive)
from models.linalg_torch import jitter_cholesky
from ppl_cl.batch import Batch, as_numpy
from ppl_cl.configs.gp_tree import GPTreeConfig, SBMGPConfig
from ppl_cl.learner import Learner
from ppl_cl.predictive import CategoricalPredictive
from ppl_cl.trees import (ClassTree, chain_tree, class_probabilities, class_prototypes, join,
                          kmeans_tree, random_tree)

from ppl_cl.errors import NotFittedError

__all__ = ["GPTree", "SBMGP", "NotFittedError", "class_exemplars"]

_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def class_exemplars(x: np.ndarray, y: np.ndarray, classes, per_class: int, n_init: int = 5,
                    seed: int = 42) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` representatives of each class: k-means++ centres of its points (ref
    GP_Tree/Learner.py ``_init_Xbar``: ``KMeans(n_init=5, max_iter=200, random_state=42)``);
    a class with at most ``per_class`` points repeats its points (as the reference does).

    Returns ``(centres (C * per_class, d), labels (C * per_class,))`` in the order of ``classes``.
    """
    from sklearn.cluster import KMeans

    out, labels = [], []
    for c in classes:
        xc = x[y == c]
        if xc.shape[0] == 0:
            raise ValueError(f"class {int(c)} has no examples: cannot place its exemplars")
        if xc.shape[0] > per_class:
            centres = KMeans(n_clusters=per_class, init="k-means++", n_init=n_init, max_iter=200,
                             random_state=seed).fit(xc).cluster_centers_
        else:
            centres = np.concatenate([xc] * (per_class // xc.shape[0] + 1))[:per_class]
        out.append(centres)
        labels.append(np.full(per_class, int(c), dtype=np.int64))
    return np.concatenate(out).astype(x.dtype), np.concatenate(labels)


@torch.no_grad()
def _embed(backbone: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
    """``backbone(x)`` in eval mode, in blocks of 4096 rows (``x`` itself without a backbone)."""
    if backbone is None:
        return x
    backbone.eval()
    if not x.shape[0]:
        return backbone(x)
    return torch.cat([backbone(x[i:i + 4096]) for i in range(0, x.shape[0], 4096)])


class GPTree(Learner):
    """GP-Tree on the learner protocol. Build as ``GPTree(config=None, **overrides)`` with a
    :class:`ppl_cl.configs.gp_tree.GPTreeConfig` (its defaults are the reference settings)."""

    learner_name = "gp-tree"
    config_cls = GPTreeConfig

    def __init__(self, config: GPTreeConfig | None = None, /, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        cfg = self.config
        self.dtype = _DTYPES[cfg.dtype]
        self.device = torch.device(cfg.device)
        self._reset()

    # -- state -------------------------------------------------------------------------------
    def _reset(self) -> None:
        self.tree: ClassTree | None = None
        self.base_tree: ClassTree | None = None
        self.nodes: dict[int, dict[str, Any]] = {}
        self.base_nodes: dict[int, dict[str, Any]] = {}
        self.input_dim: int | None = None
        self.base_classes: tuple[int, ...] = ()
        self.seen_classes: tuple[int, ...] = ()
        self.session_classes: list[tuple[int, ...]] = []
        self.exemplars: torch.Tensor | None = None        # base exemplars (features)
        self.exemplar_labels: torch.Tensor | None = None
        self.novel_x: torch.Tensor | None = None          # embeddings of novel examples
        self.novel_y: torch.Tensor | None = None
        self.backbone: nn.Module | None = None
        self.inducing: torch.Tensor | None = None         # (C_base, M, d) for VI nodes
        self.inducing_rows: dict[int, int] = {}
        g = torch.Generator()
        g.manual_seed(self.config.seed)
        self._rng_state = g.get_state()
        self._cache: dict[int, Any] = {}

    @property
    def num_classes(self) -> int:
        return (max(self.seen_classes) + 1) if self.seen_classes else 0

    @property
    def is_fitted(self) -> bool:
        return self.tree is not None

    def _generator(self) -> torch.Generator:
        g = torch.Generator()
        g.set_state(self._rng_state)
        return g

    def _draw_seed(self, g: torch.Generator) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=g).item())

    def _tensor(self, a: Any) -> torch.Tensor:
        t = a if isinstance(a, torch.Tensor) else torch.as_tensor(as_numpy(a))
        return t.to(device=self.device, dtype=self.dtype)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
        return _embed(self.backbone, x)

    def _gibbs_params(self) -> NodeKernelParams:
        c = self.config
        return NodeKernelParams(torch.tensor(c.gibbs_outputscale, dtype=self.dtype, device=self.device),
                                torch.tensor(c.lengthscale, dtype=self.dtype, device=self.device),
                                c.gibbs_jitter, c.kernel)

    def _build_tree(self, feats: np.ndarray, y: np.ndarray, classes, seed: int) -> ClassTree:
        c = self.config
        if c.tree == "chain":
            return chain_tree(classes)
        if c.tree == "random":
            return random_tree(classes, seed=seed)
        protos = class_prototypes(feats, y, classes)
        return kmeans_tree(protos, classes, n_init=c.kmeans_n_init, seed=c.kmeans_seed)

    # -- validation ----------------------------------------------------------------------------
    def _check_batch(self, batch: Any, classes) -> tuple[Batch, np.ndarray, tuple[int, ...]]:
        if not isinstance(batch, Batch):
            raise TypeError(f"batch: expected a ppl_cl.Batch, received {type(batch).__name__}")
        batch.validate(input_dim=self.input_dim)
        y = as_numpy(batch.y)
        if not np.issubdtype(y.dtype, np.integer):
            raise TypeError(f"y: expected integer class labels, received dtype {y.dtype}")
        if y.min() < 0:
            raise ValueError(f"y: expected labels >= 0, received {int(y.min())}")
        present = tuple(int(c) for c in np.unique(y))
        if classes is not None:
            declared = tuple(int(c) for c in classes)
            missing = sorted(set(declared) - set(present))
            if missing:
                raise ValueError(f"classes {missing} have no examples in this batch (a session "
                                 "must hold examples of every class it introduces)")
            extra = sorted(set(present) - set(declared))
            if extra:
                raise ValueError(f"y: labels {extra} are not among the declared classes {declared}")
        if self.tree is None:
            if len(present) < 2:
                raise ValueError(f"y: the base session holds a single class {present}; a tree "
                                 "classifier needs at least two")
        else:
            again = sorted(set(present) & set(self.seen_classes))
            if again:
                raise ValueError(f"y: classes {again} were learned in an earlier session; a novel "
                                 "session must bring new classes only (class-incremental)")
        return batch, y.astype(np.int64), present

    # -- Gibbs fits ------------------------------------------------------------------------------
    def _fit_gibbs(self, tree: ClassTree, node_ids: list[int], X: torch.Tensor, y: np.ndarray,
                   g: torch.Generator) -> dict[int, dict[str, Any]]:
        """Fit the internal nodes ``node_ids`` of ``tree`` on features ``X`` / labels ``y`` by
        Gibbs, one batched engine call per tree level."""
        c = self.config
        params = self._gibbs_params()
        engine = PGGibbs(num_chains=c.num_chains)
        wanted = set(node_ids)
        out: dict[int, dict[str, Any]] = {}
        for level in tree.levels():
            ids = [i for i in level if i in wanted]
            if not ids:
                continue
            Ks, Ls, kappas, Xs = [], [], [], []
            for i in ids:
                sel = np.isin(y, tree.nodes[i].classes)
                Xi = X[torch.as_tensor(np.flatnonzero(sel), device=X.device)]
                yi = torch.as_tensor(tree.node_labels(i, y[sel]), device=X.device)
                Ks.append(node_gram(params, Xi))
                Ls.append(jitter_cholesky(Ks[-1], name=f"K of node {i}"))
                kappas.append(yi.to(self.dtype) - 0.5)
                Xs.append(Xi)
            problem = pad_problems(Ks, kappas, Ls)
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self._draw_seed(g))
            state = engine.init(gen.get_state(), problem)
            f_trace, lm_trace = [], []
            for _ in range(c.num_steps):
                state, info = engine.step(None, state, problem)
                f_trace.append(state.f)
                lm_trace.append(info.log_marginal)
            f_all = torch.stack(f_trace)                              # (S, G, C, n)
            lm_all = torch.stack(lm_trace)                            # (S, G, C)
            for gi, i in enumerate(ids):
                n = Xs[gi].shape[0]
                out[i] = {"kind": "gibbs", "X": Xs[gi], "kappa": kappas[gi],
                          "omega": unpad(state.omega, problem, gi).contiguous(),
                          "f_trace": f_all[:, gi, :, :n].contiguous(),
                          "log_marginal_trace": lm_all[:, gi].contiguous()}
        return out

    # -- VI / DKL base session -------------------------------------------------------------------
    def _fit_vi(self, x: torch.Tensor, y: np.ndarray, classes: tuple[int, ...],
                g: torch.Generator, on_epoch=None) -> dict[str, Any]:
        c = self.config
        record: dict[str, Any] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._draw_seed(g) % (2**63))
            backbone = None if c.backbone == "none" else make_backbone(
                c.backbone, x.shape[1], c.hidden, c.embedding_dim).to(self.device, self.dtype)
            head = None if backbone is None else nn.Linear(c.embedding_dim, len(classes)).to(
                self.device, self.dtype)
        y_t = torch.as_tensor(y, device=self.device)
        cls_index = {cl: k for k, cl in enumerate(classes)}
        y_idx = torch.as_tensor([cls_index[int(v)] for v in y], device=self.device)
        N = x.shape[0]
        params: list[nn.Parameter] = []
        if backbone is not None:
            params += list(backbone.parameters()) + list(head.parameters())
        shuffle = torch.Generator()
        shuffle.manual_seed(self._draw_seed(g))
        losses: list[float] = []

        def batches():
            perm = torch.randperm(N, generator=shuffle).to(self.device)
            for s in range(0, N, c.batch_size):
                yield perm[s:s + c.batch_size]

        # cross-entropy pre-training (Sect. 3.3, App. C.3)
        lr = c.learning_rate
        if backbone is not None and c.pretrain_epochs:
            opt = torch.optim.SGD(params, lr=lr, momentum=c.momentum, weight_decay=c.weight_decay)
            sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(c.milestones), gamma=0.1)
            ce = nn.CrossEntropyLoss()
            for _ in range(c.pretrain_epochs):
                backbone.train()
                tot = 0.0
                for idx in batches():
                    opt.zero_grad()
                    loss = ce(head(backbone(x[idx])), y_idx[idx])
                    loss.backward()
                    opt.step()
                    tot += float(loss.detach()) * idx.numel()
                sched.step()
                losses.append(tot / N)
                if on_epoch is not None:
                    on_epoch("pre-training", len(losses), losses[-1])
            lr_now = sched.get_last_lr()[0]
        else:
            lr_now = lr
        feats = _embed(backbone, x)
        feats_np = as_numpy(feats).astype(np.float64)
        tree = self._build_tree(feats_np, y, classes, self._draw_seed(g) % (2**32))
        ex, ex_y = class_exemplars(feats_np, y, classes, c.inducing_per_class,
                                   n_init=c.inducing_kmeans_n_init)
        M, d = c.inducing_per_class, feats.shape[1]
        inducing = nn.Parameter(self._tensor(ex).reshape(len(classes), M, d),
                                requires_grad=c.learn_inducing)
        rows = {cl: k for k, cl in enumerate(classes)}
        engine = PGVI(c.natural_lr)
        internal = tree.internal_nodes()
        node_pos, node_n, node_params, states = {}, {}, {}, {}
        for i in internal:
            sel = np.isin(y, tree.nodes[i].classes)
            pos = np.full(N, -1, dtype=np.int64)
            pos[sel] = np.arange(int(sel.sum()))
            node_pos[i] = torch.as_tensor(pos, device=self.device)
            node_n[i] = int(sel.sum())
            node_params[i] = (
                nn.Parameter(torch.tensor(float(np.log(c.vi_outputscale)), dtype=self.dtype,
                                          device=self.device), requires_grad=c.learn_kernel),
                nn.Parameter(torch.tensor(float(np.log(c.lengthscale)), dtype=self.dtype,
                                          device=self.device), requires_grad=c.learn_kernel))
            m = M * len(tree.nodes[i].classes)
            states[i] = engine.init(node_n[i], m, self.dtype, self.device)
        right = {i: torch.as_tensor(tree.right_classes(i), device=self.device) for i in internal}
        gp_params = [inducing] if c.learn_inducing else []
        for i in internal:
            gp_params += [p for p in node_params[i] if p.requires_grad]
        opt = torch.optim.SGD(params + gp_params, lr=lr_now, momentum=c.momentum,
                              weight_decay=c.weight_decay)
        remaining = [m - c.pretrain_epochs for m in c.milestones if m > c.pretrain_epochs]
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=remaining, gamma=0.1)
        gp_losses: list[float] = []
        for _ in range(c.epochs - c.pretrain_epochs):
            if backbone is not None:
                backbone.train()
            tot, count = 0.0, 0
            for idx in batches():
                opt.zero_grad()
                z = x[idx] if backbone is None else backbone(x[idx])
                yb = y_t[idx]
                loss = z.new_zeros(())
                for i in internal:
                    pos = node_pos[i][idx]
                    sel = pos >= 0
                    if not bool(sel.any()):
                        continue
                    zb = z[sel]
                    kap = torch.isin(yb[sel], right[i]).to(self.dtype) - 0.5
                    Zbar = inducing[[rows[cl] for cl in tree.nodes[i].classes]].reshape(-1, d)
                    kp = NodeKernelParams(node_params[i][0].exp(), node_params[i][1].exp(),
                                          c.vi_jitter, c.kernel)
                    k = node_kernel(kp)
                    K_mm = k(Zbar) + c.vi_jitter * torch.eye(Zbar.shape[0], dtype=self.dtype,
                                                             device=self.device)
                    vb = VIBatch(K_mm, k(Zbar, zb), k.diag(zb) + c.vi_jitter, kap, pos[sel],
                                 node_n[i])
                    states[i], info = engine.step(None, states[i], vb)
                    loss = loss + info.loss
                loss.backward()
                opt.step()
                tot += float(loss.detach()) * idx.numel()
                count += idx.numel()
            sched.step()
            gp_losses.append(tot / max(count, 1))
            if on_epoch is not None:
                on_epoch("GP-Tree", len(losses) + len(gp_losses), gp_losses[-1])
        nodes = {}
        for i in internal:
            nodes[i] = {"kind": "vi", "eta": states[i].eta.detach(), "H": states[i].H.detach(),
                        "c": states[i].c.detach(),
                        "log_outputscale": node_params[i][0].detach().clone(),
                        "log_lengthscale": node_params[i][1].detach().clone()}
        record.update(pretrain_losses=losses, gp_losses=gp_losses,
                      final_loss=gp_losses[-1] if gp_losses else None)
        return {"tree": tree, "nodes": nodes, "inducing": inducing.detach().clone(),
                "rows": rows, "backbone": backbone, "record": record,
                "exemplars": inducing.detach().reshape(-1, d).clone(),
                "exemplar_labels": torch.as_tensor(ex_y, device=self.device)}

    # -- the protocol ----------------------------------------------------------------------------
    def update(self, batch: Batch, *, classes=None, on_epoch=None) -> dict[str, Any]:
        """Base session (first call) or novel session (later calls); see the module docstring.

        Args:
            batch: ``x (n, d)``, integer labels ``y (n,)`` (global class ids >= 0).
            classes: optional declared classes of the session: each must have examples.
            on_epoch: ``on_epoch(phase, epoch, loss)`` after every epoch of a VI base session
                (``phase`` ``"pre-training"``: cross-entropy; ``"GP-Tree"``: the per-node
                negative ELBO), e.g. a progress log line.

        Returns:
            ``session``, ``classes``, ``nodes_fitted``, ``tree_depth``, ``wall_time_s`` (and
            for a VI base session ``pretrain_losses``, ``gp_losses``, ``final_loss``).
        """
        batch, y, present = self._check_batch(batch, classes)
        t0 = time.perf_counter()
        g = self._generator()
        x = self._tensor(batch.x)
        c = self.config
        record: dict[str, Any] = {"session": len(self.session_classes), "classes": list(present)}
        if self.tree is None:
            if c.inference == "gibbs":
                feats_np = as_numpy(x).astype(np.float64)
                tree = self._build_tree(feats_np, y, present, self._draw_seed(g) % (2**32))
                nodes = self._fit_gibbs(tree, tree.internal_nodes(), x, y, g)
                ex, ex_y = class_exemplars(feats_np, y, present, c.inducing_per_class,
                                           n_init=c.inducing_kmeans_n_init)
                new = {"tree": tree, "nodes": nodes, "inducing": None, "rows": {},
                       "backbone": None, "record": {}, "exemplars": self._tensor(ex),
                       "exemplar_labels": torch.as_tensor(ex_y, device=self.device)}
            else:
                new = self._fit_vi(x, y, present, g, on_epoch=on_epoch)
            # commit
            self.tree = self.base_tree = new["tree"]
            self.nodes = dict(new["nodes"])
            self.base_nodes = dict(new["nodes"])
            self.inducing, self.inducing_rows = new["inducing"], new["rows"]
            self.backbone = new["backbone"]
            self.exemplars, self.exemplar_labels = new["exemplars"], new["exemplar_labels"]
            self.input_dim = int(x.shape[1])
            self.base_classes = present
            record.update(new["record"])
            record["nodes_fitted"] = len(new["nodes"])
        else:
            feats = self._features(x)
            tree, nodes, fitted = self._novel_session(feats, y, present, g)
            self.tree, self.nodes = tree, nodes
            self.novel_x = feats if self.novel_x is None else torch.cat([self.novel_x, feats])
            y_t = torch.as_tensor(y, device=self.device)
            self.novel_y = y_t if self.novel_y is None else torch.cat([self.novel_y, y_t])
            record["nodes_fitted"] = fitted
        self.seen_classes = tuple(self.seen_classes) + present
        self.session_classes.append(present)
        self._rng_state = g.get_state()
        self._cache = {}
        record["tree_depth"] = self.tree.depth()
        record["wall_time_s"] = time.perf_counter() - t0
        return record

    def _novel_session(self, feats: torch.Tensor, y: np.ndarray, present, g):
        c = self.config
        y_t = torch.as_tensor(y, device=self.device)
        prev_x = self.novel_x if self.novel_x is not None else feats[:0]
        prev_y = self.novel_y if self.novel_y is not None else y_t[:0]
        if c.fscil_tree == "gptree":
            nx, ny = torch.cat([prev_x, feats]), torch.cat([prev_y, y_t])
            novel_classes = tuple(int(v) for v in np.unique(as_numpy(ny)))
            sub = self._build_tree(as_numpy(nx).astype(np.float64), as_numpy(ny), novel_classes,
                                   self._draw_seed(g) % (2**32))
            tree = join(self.base_tree, sub)
            X = torch.cat([self.exemplars, nx])
            Y = torch.cat([self.exemplar_labels, ny])
            keep = dict(self.base_nodes)
            shift = len(self.base_tree.nodes)
            new_ids = [i + shift for i in sub.internal_nodes()] + [tree.root]
        elif c.fscil_tree == "session":
            sub = self._build_tree(as_numpy(feats).astype(np.float64), y, present,
                                   self._draw_seed(g) % (2**32))
            tree = join(self.tree, sub)
            X = torch.cat([self.exemplars, prev_x, feats])
            Y = torch.cat([self.exemplar_labels, prev_y, y_t])
            keep = dict(self.nodes)
            shift = len(self.tree.nodes)
            new_ids = [i + shift for i in sub.internal_nodes()] + [tree.root]
        else:  # rebuild
            X = torch.cat([self.exemplars, prev_x, feats])
            Y = torch.cat([self.exemplar_labels, prev_y, y_t])
            all_classes = tuple(self.seen_classes) + present
            tree = self._build_tree(as_numpy(X).astype(np.float64), as_numpy(Y), all_classes,
                                    self._draw_seed(g) % (2**32))
            keep = {}
            new_ids = tree.internal_nodes()
        fitted = self._fit_gibbs(tree, new_ids, X, as_numpy(Y), g)
        return tree, {**keep, **fitted}, len(fitted)

    # -- prediction ------------------------------------------------------------------------------
    def _node_cache(self, i: int) -> Any:
        if i not in self._cache:
            node = self.nodes[i]
            if node["kind"] == "gibbs":
                K = node_gram(self._gibbs_params(), node["X"])
                self._cache[i] = (K, gibbs_predictive_cache(K, node["omega"],
                                                            node["kappa"].expand_as(node["omega"])))
            else:
                kp = self._vi_params(node)
                Zbar = self._vi_inducing(i)
                L_mm = jitter_cholesky(node_gram(kp, Zbar), name=f"K_mm of node {i}")
                q = natural_to_moments(NaturalParams(node["eta"], node["H"]))
                self._cache[i] = (L_mm, q)
        return self._cache[i]

    def _vi_params(self, node) -> NodeKernelParams:
        c = self.config
        return NodeKernelParams(node["log_outputscale"].exp(), node["log_lengthscale"].exp(),
                                c.vi_jitter, c.kernel)

    def _vi_inducing(self, i: int) -> torch.Tensor:
        rows = [self.inducing_rows[cl] for cl in self.tree.nodes[i].classes]
        return self.inducing[rows].reshape(-1, self.inducing.shape[-1])

    def node_probabilities(self, feats: torch.Tensor) -> dict[int, torch.Tensor]:
        """``p(right | x)`` of every internal node at features ``feats (s, d)``."""
        c = self.config
        out = {}
        for i in self.tree.internal_nodes():
            node = self.nodes[i]
            if node["kind"] == "gibbs":
                K, cache = self._node_cache(i)
                k = node_kernel(self._gibbs_params())
                mean, var = gibbs_predictive(K, node["omega"], node["kappa"], k(node["X"], feats),
                                             k.diag(feats) + c.gibbs_jitter, cache,
                                             with_variance=c.predict != "mean")
            else:
                L_mm, q = self._node_cache(i)
                kp = self._vi_params(node)
                k = node_kernel(kp)
                Zbar = self._vi_inducing(i)
                mean, var = vi_predictive(L_mm, q, k(Zbar, feats), k.diag(feats) + c.vi_jitter)
            p = torch.sigmoid(mean) if c.predict == "mean" else \
                sigmoid_expectation(mean, var, c.quadrature_points)
            out[i] = p.mean(0) if p.dim() == 2 else p
        return out

    @torch.no_grad()
    def predict(self, x: Any, task_id: int | None = None) -> CategoricalPredictive:
        """Class probabilities ``(n, K)`` (eq. 9), ``K = max seen class + 1`` (classes not yet
        seen get probability 0)."""
        if self.tree is None:
            raise NotFittedError("GPTree.predict before any update(): no tree yet")
        xb = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        xt = self._tensor(xb.x)
        chunks = []
        for s in range(0, xt.shape[0], self.config.predict_chunk):
            feats = self._features(xt[s:s + self.config.predict_chunk])
            chunks.append(class_probabilities(self.tree, self.node_probabilities(feats),
                                              self.num_classes, feats))
        if not chunks:
            return CategoricalPredictive(np.zeros((0, self.num_classes)))
        probs = torch.cat(chunks)
        return CategoricalPredictive(as_numpy(probs).astype(np.float64))

    def embed(self, x: Any) -> np.ndarray:
        """Features the node kernels see (the backbone's embedding, or ``x`` itself)."""
        if self.input_dim is None:
            raise NotFittedError("GPTree.embed before any update()")
        xb = Batch(x).validate(input_dim=self.input_dim, require_targets=False, allow_empty=True)
        return as_numpy(self._features(self._tensor(xb.x))).astype(np.float64)

    # -- persistence -----------------------------------------------------------------------------
    @staticmethod
    def _nodes_state(nodes: dict[int, dict[str, Any]]) -> dict[str, Any]:
        return {str(i): dict(v) for i, v in nodes.items()}

    @staticmethod
    def _nodes_from_state(state: dict[str, Any]) -> dict[int, dict[str, Any]]:
        return {int(i): dict(v) for i, v in state.items()}

    def state_dict(self) -> dict[str, Any]:
        if self.tree is None:
            return {"fitted": False, "rng_state": self._rng_state}
        return {
            "fitted": True, "rng_state": self._rng_state,
            "tree": self.tree.to_state(), "base_tree": self.base_tree.to_state(),
            "nodes": self._nodes_state(self.nodes), "base_nodes": self._nodes_state(self.base_nodes),
            "input_dim": self.input_dim, "base_classes": list(self.base_classes),
            "seen_classes": list(self.seen_classes),
            "session_classes": [list(s) for s in self.session_classes],
            "exemplars": self.exemplars, "exemplar_labels": self.exemplar_labels,
            "novel_x": self.novel_x, "novel_y": self.novel_y,
            "inducing": self.inducing,
            "inducing_rows": {str(k): v for k, v in self.inducing_rows.items()},
            "backbone": None if self.backbone is None else
            {k: v.detach().clone() for k, v in self.backbone.state_dict().items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self._rng_state = torch.as_tensor(state["rng_state"], dtype=torch.uint8)
        if not state["fitted"]:
            return

        def t(v):
            if v is None:
                return None
            v = torch.as_tensor(v)
            return v.to(self.device, self.dtype) if v.is_floating_point() else v.to(self.device)

        self.tree = ClassTree.from_state(state["tree"])
        self.base_tree = ClassTree.from_state(state["base_tree"])
        conv = lambda d: {i: {k: (t(v) if isinstance(v, (torch.Tensor, np.ndarray)) else v)
                              for k, v in n.items()} for i, n in self._nodes_from_state(d).items()}
        self.nodes, self.base_nodes = conv(state["nodes"]), conv(state["base_nodes"])
        self.input_dim = int(state["input_dim"])
        self.base_classes = tuple(int(c) for c in state["base_classes"])
        self.seen_classes = tuple(int(c) for c in state["seen_classes"])
        self.session_classes = [tuple(int(c) for c in s) for s in state["session_classes"]]
        self.exemplars, self.exemplar_labels = t(state["exemplars"]), t(state["exemplar_labels"])
        self.novel_x, self.novel_y = t(state["novel_x"]), t(state["novel_y"])
        self.inducing = t(state["inducing"])
        self.inducing_rows = {int(k): int(v) for k, v in state["inducing_rows"].items()}
        if state["backbone"] is not None:
            c = self.config
            self.backbone = make_backbone(c.backbone, self.input_dim, c.hidden,
                                          c.embedding_dim).to(self.device, self.dtype)
            self.backbone.load_state_dict({k: t(v) for k, v in state["backbone"].items()})

    # -- ArviZ -----------------------------------------------------------------------------------
    @torch.no_grad()
    def _log_likelihood(self, x: Any, y: Any) -> np.ndarray:
        """``log p(y_n | f)`` per draw of every node's chains, ``(chains, draws, n)``: eq. 9's
        product along the root-to-leaf path of ``y_n``, ``sum log sigma(+-f_node(x_n))``, with
        ``f_node(x_n)`` the draws at the node's own training point ``x_n`` (the nodes'
        posteriors are independent, so one (chain, draw) of every node is a joint draw).
        Raises ValueError when a point is not among the training points of a node on its path
        (the chains hold f there only) or a node on the path has no chains (VI)."""
        xb = Batch(x, y).validate(input_dim=self.input_dim)
        y_np = as_numpy(xb.y).astype(np.int64)
        unknown = sorted(set(np.unique(y_np).tolist()) - set(self.tree.classes))
        if unknown:
            raise ValueError(f"y: classes {unknown} are not in the tree {self.tree.classes}")
        feats = as_numpy(self._features(self._tensor(xb.x)))
        n = feats.shape[0]
        first = self.nodes[self.tree.root]
        if first["kind"] != "gibbs":
            raise ValueError("log_likelihood needs Gibbs chains at every node (the root was "
                             "fitted by VI)")
        S, C = first["f_trace"].shape[:2]
        out = np.zeros((C, S, n))
        for i in self.tree.internal_nodes():
            on_path = np.isin(y_np, self.tree.nodes[i].classes)
            if not on_path.any():
                continue
            node = self.nodes[i]
            if node["kind"] != "gibbs":
                raise ValueError(f"log_likelihood needs Gibbs chains at every node on the "
                                 f"paths (node {i} was fitted by VI)")
            rows = {r.tobytes(): j for j, r in enumerate(as_numpy(node["X"]))}
            idx = [rows.get(r.tobytes(), -1) for r in feats[on_path]]
            if -1 in idx:
                k = int(np.flatnonzero(on_path)[idx.index(-1)])
                raise ValueError(f"x[{k}] (class {int(y_np[k])}) is not a training point of "
                                 f"node {i}: the chains hold f at each node's training points "
                                 "only (pass the data the tree was fitted on)")
            f = node["f_trace"][:, :, torch.as_tensor(idx, device=self.device)]  # (S, C, m)
            sign = torch.as_tensor(2.0 * self.tree.node_labels(i, y_np[on_path]) - 1.0,
                                   dtype=self.dtype, device=self.device)
            out[:, :, on_path] += as_numpy(
                torch.nn.functional.logsigmoid(sign * f).permute(1, 0, 2)).astype(np.float64)
        return out

    def to_inference_data(self, nodes: list[int] | None = None, x: Any = None, y: Any = None):
        """InferenceData of the Gibbs chains of the internal nodes: ``posterior`` holds
        ``f_node<i>`` with dims ``(chain, draw, obs_node<i>)`` (every sweep after the prior
        initialization: ``num_chains`` independent chains of ``num_steps`` draws, none
        removed as warm-up), ``sample_stats`` the augmented log marginal (eq. 10) per sweep as
        ``log_marginal_node<i>``. VI nodes have no chains and are left out; the tree is in
        ``attrs``. With ``x, y`` (the training data of the fitted nodes, e.g. the base
        session's batch): ``log_likelihood.y`` (:meth:`_log_likelihood`) and
        ``observed_data.y``, for ``az.loo`` / ``az.compare``."""
        from ppl_cl.inference_data import mcmc_attrs, samples_to_inference_data

        if self.tree is None:
            raise NotFittedError("GPTree.to_inference_data before any update()")
        ids = [i for i in (self.tree.internal_nodes() if nodes is None else nodes)
               if self.nodes[i]["kind"] == "gibbs"]
        if not ids:
            raise ValueError("no Gibbs node in the tree (a VI tree has no chains to export)")
        if (x is None) != (y is None):
            raise ValueError("x, y: give both (the training points and their labels) or neither")
        samples, stats, dims = {}, {}, {}
        for i in ids:
            f = self.nodes[i]["f_trace"].permute(1, 0, 2)            # (chain, draw, n)
            samples[f"f_node{i}"] = as_numpy(f)
            stats[f"log_marginal_node{i}"] = as_numpy(self.nodes[i]["log_marginal_trace"].T)
            dims[f"f_node{i}"] = [f"obs_node{i}"]
        extra: dict[str, Any] = {}
        if x is not None:
            extra = {"log_likelihood": {"y": self._log_likelihood(x, y)},
                     "observed_data": {"y": as_numpy(y).astype(np.int64)}}
            dims["y"] = ["obs"]
        return samples_to_inference_data(
            samples, dims=dims, sample_stats=stats,
            attrs={**mcmc_attrs("Polya-Gamma block Gibbs per node (eqs. 3-4)",
                                "independent chains from the GP prior, every sweep kept (no "
                                "warm-up removed): r_hat and ESS diagnose the sampler"),
                   "tree": self.tree.describe(), "learner": self.learner_name}, **extra)


class SBMGP(GPTree):
    """Stick-break multinomial GP (Linderman et al. 2015): GP-Tree's machinery on the chain tree
    (``SBMGPConfig``, ``tree="chain"``): node j separates class j from the classes after it.

    Prior mean: zero at every node, as for GP-Tree's nodes. Linderman et al. (2015) choose the
    means ``mu_j`` of the stick-breaking GPs so that the prior over classes is uniform (under
    zero means the chain puts prior mass ``2^-(j+1)`` on class j, ``2^-(C-1)`` on the last);
    the authors' GP-Tree code uses zero means for every GP (GPyTorch's ``ConstantMean``,
    initialized to 0 and not trained by Gibbs; GP_Tree/kernel_class.py, gp_model_gibbs.py), so
    the SBM-GP row of Table 1 is taken to be zero-mean too. Checked against NUTS on the
    stick-breaking model in ``tests/ppl_cl/learners/test_sbm_gp_nuts.py``."""

    learner_name = "sbm-gp"
    config_cls = SBMGPConfig

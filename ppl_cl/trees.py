"""Class trees of GP-Tree (Achituve et al. 2021, Sect. 3.1 and 3.4).

A :class:`ClassTree` is a binary tree over class labels: every internal node splits its classes
into a left and a right child; leaves hold one class. Node ``v`` decides "right" with
probability ``p_v(x)``, so

    p(y = c | x) = prod_{v in path(c)} p_v(x)^{[right at v]} (1 - p_v(x))^{[left at v]}  (eq. 9)

which sums to one over the classes at every x (each internal node splits the mass of its
subtree in two).

Builders: :func:`kmeans_tree` (divisive 2-means with k-means++ on L2-normalized class
prototypes, scikit-learn's ``KMeans``), :func:`random_tree` (a random balanced split, "GP-Tree
Rnd." of Table 1) and :func:`chain_tree` (the stick-breaking chain of SBM-GP, Fig. 1a);
:func:`join` puts two trees under a new root (novel sessions, Fig. 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["TreeNode", "ClassTree", "class_prototypes", "kmeans_tree", "random_tree",
           "chain_tree", "join", "class_probabilities"]


@dataclass
class TreeNode:
    """``classes`` of the subtree; ``left`` / ``right`` child indices (``-1`` for a leaf)."""

    classes: tuple[int, ...]
    left: int = -1
    right: int = -1

    @property
    def is_leaf(self) -> bool:
        return self.left < 0


@dataclass
class ClassTree:
    """Nodes in a list, ``root`` the index of the root."""

    nodes: list[TreeNode]
    root: int = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def classes(self) -> tuple[int, ...]:
        return self.nodes[self.root].classes

    def internal_nodes(self) -> list[int]:
        """Indices of the internal nodes reachable from the root, breadth first."""
        return [i for i in self.breadth_first() if not self.nodes[i].is_leaf]

    def breadth_first(self) -> list[int]:
        order, queue = [], [self.root]
        while queue:
            i = queue.pop(0)
            order.append(i)
            if not self.nodes[i].is_leaf:
                queue += [self.nodes[i].left, self.nodes[i].right]
        return order

    def levels(self) -> list[list[int]]:
        """Internal nodes grouped by depth (root first): the nodes one batched Gibbs call fits."""
        out: list[list[int]] = []
        frontier = [self.root]
        while frontier:
            inner = [i for i in frontier if not self.nodes[i].is_leaf]
            if inner:
                out.append(inner)
            frontier = [c for i in inner for c in (self.nodes[i].left, self.nodes[i].right)]
        return out

    def right_classes(self, i: int) -> tuple[int, ...]:
        return self.nodes[self.nodes[i].right].classes

    def node_labels(self, i: int, y: np.ndarray) -> np.ndarray:
        """Node labels of points of node ``i``'s classes: 1 if the class is in the right child."""
        return np.isin(y, self.right_classes(i)).astype(np.int64)

    def depth(self) -> int:
        return len(self.levels())

    # -- persistence ---------------------------------------------------------------------------
    def to_state(self) -> dict:
        return {"classes": [list(n.classes) for n in self.nodes],
                "left": [n.left for n in self.nodes], "right": [n.right for n in self.nodes],
                "root": self.root}

    @classmethod
    def from_state(cls, state: dict) -> "ClassTree":
        nodes = [TreeNode(tuple(int(c) for c in cl), int(l), int(r))
                 for cl, l, r in zip(state["classes"], state["left"], state["right"])]
        return cls(nodes, int(state["root"]))

    def describe(self, names: Sequence[str] | None = None) -> str:
        """Indented text of the tree (leaves by class name when ``names`` is given)."""
        lines: list[str] = []

        def rec(i: int, depth: int) -> None:
            node = self.nodes[i]
            label = ", ".join(names[c] if names else str(c) for c in node.classes)
            lines.append("  " * depth + ("- " if node.is_leaf else "+ ") + f"[{label}]")
            if not node.is_leaf:
                rec(node.left, depth + 1)
                rec(node.right, depth + 1)

        rec(self.root, 0)
        return "\n".join(lines)


def class_prototypes(x: np.ndarray, y: np.ndarray, classes: Sequence[int]) -> np.ndarray:
    """Mean feature of each class, L2-normalized (Sect. 3.1): ``(len(classes), d)``.

    Raises:
        ValueError: a class with no example.
    """
    protos = []
    missing = [int(c) for c in classes if not np.any(y == c)]
    if missing:
        raise ValueError(f"classes {missing} have no examples: a class prototype needs at least "
                         "one")
    for c in classes:
        m = x[y == c].mean(axis=0)
        protos.append(m / max(float(np.linalg.norm(m)), 1e-12))
    return np.stack(protos)


def _split_kmeans(protos: np.ndarray, n_init: int, seed: int) -> np.ndarray:
    from sklearn.cluster import KMeans

    labels = KMeans(n_clusters=2, init="k-means++", n_init=n_init,
                    random_state=seed).fit(protos).labels_
    if labels.min() == labels.max():          # identical prototypes: split in two halves
        labels = (np.arange(len(protos)) >= len(protos) // 2).astype(int)
    return labels


def _build(classes: tuple[int, ...], split, nodes: list[TreeNode]) -> int:
    idx = len(nodes)
    nodes.append(TreeNode(classes))
    if len(classes) == 1:
        return idx
    left, right = split(classes)
    nodes[idx].left = _build(tuple(left), split, nodes)
    nodes[idx].right = _build(tuple(right), split, nodes)
    return idx


def kmeans_tree(prototypes: np.ndarray, classes: Sequence[int], n_init: int = 50,
                seed: int = 42) -> ClassTree:
    """Divisive 2-means on the (L2-normalized) prototypes, one row per class (Sect. 3.1; ref
    GP_Tree/class_splits.py). Two classes are split one to a side, in label order."""
    classes = tuple(int(c) for c in classes)
    if len(classes) < 1:
        raise ValueError("classes: expected at least one class")
    row = {c: i for i, c in enumerate(classes)}

    def split(cs):
        if len(cs) == 2:
            return (cs[0],), (cs[1],)
        lab = _split_kmeans(prototypes[[row[c] for c in cs]], n_init, seed)
        return [c for c, l in zip(cs, lab) if l == 0], [c for c, l in zip(cs, lab) if l == 1]

    nodes: list[TreeNode] = []
    _build(classes, split, nodes)
    return ClassTree(nodes, 0)


def random_tree(classes: Sequence[int], seed: int = 0) -> ClassTree:
    """A balanced tree over a random order of the classes ("GP-Tree Rnd.", Table 1)."""
    rng = np.random.default_rng(seed)
    order = tuple(int(c) for c in rng.permutation(np.asarray(list(classes))))

    def split(cs):
        h = len(cs) // 2
        return cs[:h], cs[h:]

    nodes: list[TreeNode] = []
    _build(order, split, nodes)
    return ClassTree(nodes, 0)


def chain_tree(classes: Sequence[int]) -> ClassTree:
    """The stick-breaking chain: node j splits class j (left) from the classes after it."""
    classes = tuple(int(c) for c in classes)

    def split(cs):
        return cs[:1], cs[1:]

    nodes: list[TreeNode] = []
    _build(classes, split, nodes)
    return ClassTree(nodes, 0)


def join(left: ClassTree, right: ClassTree) -> ClassTree:
    """A new root with ``left`` and ``right`` as its subtrees (Fig. 2c). Node indices of
    ``left`` are kept; those of ``right`` are shifted by ``len(left.nodes)``; the root is last."""
    shift = len(left.nodes)
    nodes = [TreeNode(n.classes, n.left, n.right) for n in left.nodes]
    for n in right.nodes:
        nodes.append(TreeNode(n.classes, n.left + shift if n.left >= 0 else -1,
                              n.right + shift if n.right >= 0 else -1))
    nodes.append(TreeNode(left.classes + right.classes, left.root, right.root + shift))
    return ClassTree(nodes, len(nodes) - 1)


def class_probabilities(tree: ClassTree, p_right: dict, num_classes: int, like):
    """Eq. 9: ``(n, num_classes)`` class probabilities from each internal node's
    ``p_right[i] (n,)`` (torch tensors), products along the root-to-leaf paths; columns of
    classes not in the tree are 0."""
    import torch

    n = next(iter(p_right.values())).shape[0] if p_right else 0
    probs = torch.zeros(n, num_classes, dtype=like.dtype, device=like.device)
    stack = [(tree.root, torch.ones(n, dtype=like.dtype, device=like.device))]
    while stack:
        i, mass = stack.pop()
        node = tree.nodes[i]
        if node.is_leaf:
            probs[:, node.classes[0]] = mass
            continue
        p = p_right[i]
        stack.append((node.left, mass * (1.0 - p)))
        stack.append((node.right, mass * p))
    return probs

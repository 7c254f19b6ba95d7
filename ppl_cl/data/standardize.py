"""Standardization of the protocols' data, shared by the experiments and ``ppl-cl compare``.

* :func:`zscore` -- the VIPS reference's ``utils_data.normalise`` over the whole set;
* :func:`split_and_center` -- GP-ELLA's multi-task split (Sect. 5.2): 50/50 per task, features
  standardized with the pooled training statistics, then centred per task.
"""

from __future__ import annotations

import numpy as np

__all__ = ["zscore", "split_and_center"]


def zscore(a: np.ndarray) -> np.ndarray:
    """``(a - mean) / (std + 1e-6)`` over the whole set (``utils_data.normalise``)."""
    return (a - a.mean(0)) / (a.std(0) + 1e-6)


def split_and_center(tasks: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator):
    """50/50 split per task; features standardized with pooled training statistics, then
    features and targets centred on each task's training means (Sect. 5.2)."""
    raw = []
    for x, y in tasks:
        perm = rng.permutation(len(y))
        h = len(y) // 2 if len(y) > 1 else 1
        raw.append((x[perm[:h]], y[perm[:h]], x[perm[h:]], y[perm[h:]]))
    Xtr = np.concatenate([r[0] for r in raw])
    mean, std = Xtr.mean(axis=0), Xtr.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    out = []
    for xt, yt, xs, ys in raw:
        xt, xs = (xt - mean) / std, (xs - mean) / std
        mx, my = xt.mean(axis=0), yt.mean()
        out.append((xt - mx, yt - my, xs - mx, ys - my))
    return out

"""Figures shared by the experiments: each function returns a matplotlib figure (the caller
saves it, e.g. ``ctx.savefig(fig, name)``) and takes its labels as arguments."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["matrix_figure", "curves_figure"]


def matrix_figure(M: np.ndarray, title: str, *, colorbar_label: str, vmin: float = 0.0,
                  vmax: float = 1.0, fmt: str = "{:.2f}", cmap: str = "viridis",
                  dark_below: float = 0.6, xlabel: str = "test task",
                  ylabel: str = "trained up to task"):
    """A ``(T, T)`` task-by-task matrix (accuracy ``R[i, j]``, predictive entropy) as a heat
    map with every cell written in (VAR-GP Fig. 3). ``dark_below``: cells whose value, scaled
    to [0, 1] by ``vmin, vmax``, is below it get white text."""
    import matplotlib.pyplot as plt

    M = np.asarray(M, dtype=float)
    T = M.shape[0]
    fig, ax = plt.subplots(figsize=(0.6 * T + 2.2, 0.6 * T + 1.6))
    im = ax.imshow(M, vmin=vmin, vmax=vmax, cmap=cmap)
    for i in range(T):
        for j in range(M.shape[1]):
            rel = (M[i, j] - vmin) / (vmax - vmin)
            ax.text(j, i, fmt.format(M[i, j]), ha="center", va="center", fontsize=7,
                    color="white" if rel < dark_below else "black")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks(range(M.shape[1]))
    ax.set_yticks(range(T))
    fig.colorbar(im, ax=ax, label=colorbar_label)
    ax.set_title(title)
    return fig


def curves_figure(curves: Mapping[str, Sequence[float]], title: str, *, xlabel: str,
                  ylabel: str, ylim: tuple[float, float] | None = None, start: int = 1):
    """One line per label over steps ``start, start + 1, ...`` (e.g. VAR-GP Fig. 6: average
    accuracy over the tasks seen, one line per Table 1 row)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, values in curves.items():
        values = np.asarray(values, dtype=float)
        ax.plot(np.arange(start, start + len(values)), values, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return fig

"""Feature extractors for deep kernel learning (GP-Tree Sect. 3.3): ``g_theta(x)`` whose
output the node kernels see (after L2 normalization inside the kernels).

Small stand-ins for the paper's ResNet-18 (App. C.2-C.3), sized for a CPU: an MLP for vector
inputs and a two-convolution CNN for 28 x 28 images (MNIST).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

__all__ = ["MLPBackbone", "SmallCNN", "make_backbone"]


class MLPBackbone(nn.Module):
    """``Linear -> ReLU`` blocks then a linear embedding of size ``embedding_dim``."""

    def __init__(self, input_dim: int, hidden: Sequence[int], embedding_dim: int):
        super().__init__()
        layers: list[nn.Module] = []
        d = input_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        layers.append(nn.Linear(d, embedding_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """Two 3x3 convolutions (32, 64 channels) with max-pooling, then a linear embedding; input
    ``(n, 784)`` rows of 28 x 28 images."""

    def __init__(self, embedding_dim: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(64 * 7 * 7, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x.reshape(-1, 1, 28, 28))
        return self.head(h.flatten(1))


def make_backbone(kind: str, input_dim: int, hidden: Sequence[int], embedding_dim: int) -> nn.Module:
    if kind == "mlp":
        return MLPBackbone(input_dim, hidden, embedding_dim)
    if kind == "cnn":
        if input_dim != 784:
            raise ValueError(f"backbone='cnn' expects 28 x 28 images (784 features), received "
                             f"{input_dim} features")
        return SmallCNN(embedding_dim)
    raise ValueError(f"backbone: expected 'mlp' or 'cnn', received {kind!r}")

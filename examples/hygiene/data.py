"""The example's fixed synthetic regression task, shared by training and validation.

Both processes regenerate the same split from one seed, so the validation worker
never depends on state held by the training process.
"""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 8
SEED = 1234


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def make_split(n_train: int = 4096, n_val: int = 1024):
    """(x_train, y_train, x_val, y_val): y = sin(x·w) + noise, an offset large enough that the raw loss misleads."""
    gen = torch.Generator().manual_seed(SEED)
    w = torch.randn(FEATURES, 1, generator=gen)
    x = torch.randn(n_train + n_val, FEATURES, generator=gen)
    y = torch.sin(x @ w) + 0.3 * torch.randn(n_train + n_val, 1, generator=gen)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def r2(pred: torch.Tensor, target: torch.Tensor) -> float:
    residual = torch.mean((pred - target) ** 2)
    return float(1.0 - residual / torch.var(target, unbiased=False))

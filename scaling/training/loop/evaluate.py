"""Validation loss: mean next-token cross-entropy over fixed windows, split evenly over the ranks.

Every rank must run the same number of forward passes: a sharded (FSDP) model all-gathers its
weights inside each forward, so a rank with one batch fewer than the others would leave them
waiting forever. The window list is therefore padded to a multiple of ``world_size *
batch_size`` with copies of window 0 whose weight is 0; rank r takes the r-th contiguous block;
each rank sums ``weight * per-window mean CE`` and the count of real windows, and one
all-reduce gives every rank

    val_loss = sum_w CE_w / n_windows          (all windows have seq_len tokens)

the mean over tokens. Routing is per token (no expert capacity), so the padding rows do not
change the real rows' losses. Several window sets (the whole split, and one per data source)
are evaluated in one call: ``val_loss`` plus ``val_loss/<source>``.
"""

from __future__ import annotations

import contextlib
from typing import Mapping

import numpy as np
import torch

Windows = tuple[np.ndarray, np.ndarray]


def autocast(device: torch.device):
    """bf16 autocast on CUDA (fp32 master weights), nothing on CPU (fp32)."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Evaluator:
    """Evaluates a model on named window sets (name "" is the whole split -> ``val_loss``)."""

    def __init__(self, windows: Mapping[str, Windows], batch_size: int, device: torch.device,
                 rank: int = 0, world: int = 1):
        self.windows = dict(windows)
        self.batch_size = batch_size
        self.device = device
        self.rank, self.world = rank, world

    @property
    def n_windows(self) -> int:
        return int(len(self.windows[""][0])) if "" in self.windows else 0

    @torch.no_grad()
    def loss(self, model: torch.nn.Module, windows: Windows) -> float:
        """Mean cross-entropy (nats/token) over ``windows``; the same value on every rank."""
        x_all, y_all = windows
        n = len(x_all)
        chunk = self.world * self.batch_size
        padded = -(-n // chunk) * chunk
        idx = np.concatenate([np.arange(n), np.zeros(padded - n, dtype=np.int64)])
        weight = np.concatenate([np.ones(n), np.zeros(padded - n)])
        per_rank = padded // self.world
        mine = slice(self.rank * per_rank, (self.rank + 1) * per_rank)
        idx, weight = idx[mine], weight[mine]
        was_training = model.training
        model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)
        for i in range(0, per_rank, self.batch_size):
            rows = idx[i:i + self.batch_size]
            x = torch.from_numpy(x_all[rows]).to(self.device)
            y = torch.from_numpy(y_all[rows]).to(self.device)
            with autocast(self.device):
                ce = model(x, y, return_per_token_loss=True).per_token_loss
            w = torch.from_numpy(weight[i:i + self.batch_size]).to(self.device)
            total[0] += (ce.double().mean(1) * w).sum()
            total[1] += w.sum()
        if self.world > 1:
            torch.distributed.all_reduce(total)
        model.train(was_training)
        return float(total[0] / total[1])

    def __call__(self, model: torch.nn.Module, bpb=None) -> dict[str, float]:
        """``val_loss`` (and ``val_bpb`` through ``bpb``) plus ``val_loss/<name>`` per named set."""
        out: dict[str, float] = {}
        for name, windows in self.windows.items():
            loss = self.loss(model, windows)
            if name:
                out[f"val_loss/{name}"] = loss
            else:
                out["val_loss"] = loss
                if bpb is not None:
                    out["val_bpb"] = bpb(loss)
        return out

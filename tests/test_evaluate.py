"""Evaluator: padding gives every rank the same number of forward passes and leaves the mean exact."""

import numpy as np
import pytest
import torch

from scaling.accounting.tiers import get_config
from scaling.training.loop.evaluate import Evaluator
from scaling.training.model.transformer import MoETransformer


class Counting(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, *args, **kw):
        self.calls += 1
        return self.model(*args, **kw)


def windows(n, seq_len=64, vocab=512, seed=0):
    tokens = np.random.default_rng(seed).integers(0, vocab, size=(n, seq_len + 1))
    return tokens[:, :-1].astype(np.int64), tokens[:, 1:].astype(np.int64)


def test_padding_is_masked_and_ranks_do_equal_work(monkeypatch):
    cfg = get_config("proxy-tiny", "smelt")
    model = MoETransformer(cfg, seed=0)
    w = windows(13, cfg.seq_len, cfg.vocab_size)
    x, y = (torch.from_numpy(a) for a in w)
    with torch.no_grad():
        direct = float(model(x, y).loss)  # mean over all 13 x 64 tokens
    one = Evaluator({"": w}, batch_size=4, device=torch.device("cpu"))
    assert one.loss(model, w) == pytest.approx(direct, rel=1e-6)  # 13 padded to 16, 3 masked

    # two ranks, the all-reduce replaced by collecting each rank's (sum, count)
    parts = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda t: parts.append(t.clone()))
    calls = []
    for rank in (0, 1):
        counted = Counting(model)
        Evaluator({"": w}, batch_size=4, device=torch.device("cpu"), rank=rank, world=2).loss(counted, w)
        calls.append(counted.calls)
    assert calls == [2, 2]  # 13 windows -> 16 = 2 ranks x 2 batches of 4
    total = parts[0] + parts[1]
    assert total[1] == 13 and float(total[0] / total[1]) == pytest.approx(direct, rel=1e-6)


def test_named_sets_give_per_source_keys():
    cfg = get_config("proxy-tiny", "baseline")
    model = MoETransformer(cfg, seed=0)
    sets = {"": windows(4, cfg.seq_len, cfg.vocab_size), "a": windows(2, cfg.seq_len, cfg.vocab_size, 1)}
    ev = Evaluator(sets, batch_size=8, device=torch.device("cpu"))
    out = ev(model, bpb=lambda loss: loss / 2)
    assert set(out) == {"val_loss", "val_bpb", "val_loss/a"} and out["val_bpb"] == out["val_loss"] / 2

"""Greedy decoding of a batch of prompts with the trained model (no KV cache)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from scaling.analysis.runs import batched
from scaling.training.data.corpus import EOS_ID
from scaling.training.model.transformer import MoETransformer


def greedy_decode(model: MoETransformer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  stop: Callable[[list[int]], bool], batch_size: int = 32) -> list[list[int]]:
    """Greedy continuations of token-id prompts, up to ``max_new_tokens`` each or until
    ``stop(generated ids)`` is true.

    Prompts are right-padded into one batch: with causal attention and per-token routing
    (no capacity, nothing dropped) the logits at a row's last real position do not depend on
    the padding after it, so each step is one forward pass of the batch (no KV cache).
    """
    device = next(model.parameters()).device
    results: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths together
    for chunk in batched(order, batch_size):
        lens = [len(prompts[i]) for i in chunk]
        width = max(lens) + max_new_tokens
        ids = torch.full((len(chunk), width), EOS_ID, dtype=torch.long, device=device)
        for r, i in enumerate(chunk):
            ids[r, :lens[r]] = torch.as_tensor(list(prompts[i]), device=device)
        cur = torch.as_tensor(lens, device=device)
        done = [False] * len(chunk)
        for _ in range(max_new_tokens):
            live = [r for r in range(len(chunk)) if not done[r]]
            if not live:
                break
            upto = int(cur.max())
            with torch.no_grad():
                logits = model(ids[:, :upto]).logits
            nxt = logits[torch.arange(len(chunk), device=device), cur - 1].argmax(-1)
            for r in live:
                t = int(nxt[r])
                ids[r, int(cur[r])] = t
                results[chunk[r]].append(t)
                cur[r] += 1
                if t == EOS_ID or stop(results[chunk[r]]):
                    done[r] = True
    return results


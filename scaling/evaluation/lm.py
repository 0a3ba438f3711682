"""The native lm-eval model: ``lm_eval.api.model.TemplateLM`` over our own forward.

It runs every tier, including those Mixtral cannot represent (odd head sizes, shared experts),
and follows lm-eval's ``hf`` backend (``lm_eval.models.huggingface.HFLM``, 0.4.x) wherever that
decides a number, so the two agree on an exported model (tests/test_eval.py):

* tokens: the run's own tokenizer, no special tokens added; ``prefix_token_id`` = ``<|bos|>``
  (what the training stream puts before each document; HFLM uses the tokenizer's bos too),
  ``eot_token_id`` = ``<|eos|>``; ``max_length`` = the training context ``seq_len`` (HFLM reads it
  from ``max_position_embeddings``);
* ``loglikelihood``: context + continuation truncated from the left to ``max_length + 1`` tokens,
  the last dropped; log-softmax in fp32; the continuation's summed log-probability and whether
  it is the greedy continuation; a continuation longer than ``max_length`` (which HFLM refuses
  with an assertion) in pieces of ``max_length // 2`` tokens (``loglikelihood_in_pieces``; the
  ``hf`` backend of ``smelt-scale eval`` does the same);
* ``loglikelihood_rolling``: ``lm_eval.utils.get_rolling_token_windows`` with context length 1
  and ``make_disjoint_window``, i.e. disjoint windows of ``max_length`` tokens, the first one
  conditioned on the prefix token; the document's log-likelihood is the sum over windows;
* ``generate_until``: greedy decoding until a stop string, ``<|eos|>`` or ``max_gen_toks``; the
  context keeps its last ``max_length - max_gen_toks`` tokens, with ``max_gen_toks`` capped at
  half the context (a 256-token proxy cannot hold HumanEval's 1024). No KV cache: each new token
  reruns the forward on the whole (short) sequence, one request at a time.

Batches: loglikelihood requests are sorted by length, longest first, batched (right padding;
causal attention keeps padding out of the real positions) and the results put back in request
order. CUDA runs under bf16 autocast (fp32 weights). Data parallel: under ``torch.distributed``,
``rank``/``world_size``/``all_gather``/``gather_object``/``barrier`` are the process group's, so
lm-eval's evaluator gives each rank its share of the requests and gathers the results.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from scaling.training.loop.evaluate import autocast


def continuation_pieces(context: list[int], continuation: list[int], max_length: int) -> list[tuple]:
    """(context, piece) token requests that score ``continuation`` after ``context`` in pieces of
    at most ``max_length // 2`` tokens, each given everything before it truncated from the left
    to ``max_length + 1`` tokens (as lm-eval truncates any request), so that every piece keeps at
    least half a context of conditioning. The sum of the pieces' log-likelihoods is
    log p(continuation | context) by the chain rule, up to that truncation."""
    step = max(1, max_length // 2)
    return [
        ((list(context) + list(continuation[:i]))[-(max_length + 1) :], list(continuation[i : i + step]))
        for i in range(0, len(continuation), step)
    ]


def loglikelihood_in_pieces(score, requests: list, max_length: int) -> list[tuple[float, bool]]:
    """``score`` (an lm-eval ``_loglikelihood_tokens``) on ``requests`` ((key, context, continuation)
    token triples), where a continuation longer than ``max_length`` is scored as its
    :func:`continuation_pieces` and their results summed (greedy: every piece greedy). Neither
    backend can hold such a continuation in one forward (lm-eval's hf asserts
    ``len(continuation) <= max_length``; a long PIQA solution against a 64-token proxy); requests
    that fit are passed through as they are, so both backends still score them alike."""
    flat, owner = [], []
    for i, (key, ctx, cont) in enumerate(requests):
        if len(cont) > max_length:
            flat += [(None, c, p) for c, p in continuation_pieces(ctx, cont, max_length)]
            owner += [i] * (len(flat) - len(owner))
        else:
            flat.append((key, ctx, cont))
            owner.append(i)
    if len(flat) == len(requests):
        return score(requests)
    out = [[0.0, True] for _ in requests]
    for i, (ll, greedy) in zip(owner, score(flat)):
        out[i][0] += float(ll)
        out[i][1] = out[i][1] and bool(greedy)
    return [(ll, greedy) for ll, greedy in out]


class NativeLM(TemplateLM):
    """lm-eval model over a ``scaling.training.model.transformer.MoETransformer`` and a
    ``tokenizers.Tokenizer``."""

    backend = "causal"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        bos_id: int,
        eos_id: int,
        pad_id: int,
        max_length: int | None = None,
        batch_size: int = 16,
        max_gen_toks: int = 256,
        device: str | torch.device | None = None,
    ):
        super().__init__()
        self.model = model.eval()
        self.tok = tokenizer
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self._max_length = int(max_length or model.cfg.seq_len)
        self.batch_size = max(1, int(batch_size))
        self._max_gen_toks = int(max_gen_toks)
        self._device = torch.device(device) if device is not None else next(model.parameters()).device
        dist = torch.distributed
        self._distributed = dist.is_available() and dist.is_initialized()
        self._rank = dist.get_rank() if self._distributed else 0
        self._world_size = dist.get_world_size() if self._distributed else 1

    # ----- distributed --------------------------------------------------------------------
    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._distributed:
            return tensor
        parts = [torch.zeros_like(tensor) for _ in range(self._world_size)]
        torch.distributed.all_gather(parts, tensor)
        return torch.cat([p.reshape(-1, *tensor.shape[1:]) if tensor.ndim else p.reshape(1) for p in parts])

    def gather_object(self, obj: Any, dst: int = 0) -> list | None:
        if not self._distributed:
            return [obj]
        out = [None] * self._world_size if self._rank == dst else None
        torch.distributed.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        if self._distributed:
            torch.distributed.barrier()

    # ----- tokens -------------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.bos_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return "smelt-scale-bpe"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tok.encode(string, add_special_tokens=False).ids

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tok.decode(tokens, skip_special_tokens=False)

    # ----- scoring ------------------------------------------------------------------------
    @torch.no_grad()
    def _logprobs(self, rows: list[list[int]]) -> torch.Tensor:
        """Log-softmax [B, T, V] (fp32) of right-padded rows."""
        T = max(len(r) for r in rows)
        ids = torch.full((len(rows), T), self.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        with autocast(self._device):
            logits = self.model(ids.to(self._device)).logits
        return F.log_softmax(logits.float(), dim=-1)

    def _loglikelihood_tokens(
        self, requests: list, disable_tqdm: bool = False, **kwargs
    ) -> list[tuple[float, bool]]:
        """(sum log p(continuation | context), continuation is greedy) per (key, context, continuation);
        a continuation longer than the context in pieces (:func:`loglikelihood_in_pieces`)."""
        out = loglikelihood_in_pieces(self._score, requests, self._max_length)
        if self.cache_hook is not None:
            for req, res in zip(requests, out):
                if req[0] is not None:
                    self.cache_hook.add_partial("loglikelihood", req[0], res)
        return out

    def _score(self, requests: list) -> list[tuple[float, bool]]:
        """:meth:`_loglikelihood_tokens` for continuations of at most ``max_length`` tokens."""
        order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            rows, conts = [], []
            for i in chunk:
                _, ctx, cont = requests[i]
                if not ctx or not cont:
                    raise ValueError("a loglikelihood request needs a non-empty context and continuation")
                rows.append((list(ctx) + list(cont))[-(self._max_length + 1) :][:-1])
                conts.append(list(cont))
            logp = self._logprobs(rows)
            for b, i in enumerate(chunk):
                n, c = len(rows[b]), conts[b]
                lp = logp[b, n - len(c) : n]  # [len(c), V]
                target = torch.tensor(c, dtype=torch.long, device=lp.device)
                score = float(lp.gather(-1, target[:, None]).sum())
                greedy = bool((lp.argmax(dim=-1) == target).all())
                out[i] = (score, greedy)
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in [r.args for r in requests]:
            windows = [
                (None,) + lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self._max_length,
                    context_len=1,
                )
            ]
            out.append(sum(s for s, _ in self._loglikelihood_tokens(windows)))
        return out

    # ----- generation ---------------------------------------------------------------------
    @torch.no_grad()
    def greedy(self, context: list[int], until: list[str], max_gen_toks: int) -> str:
        max_gen = max(1, min(max_gen_toks, self._max_length // 2))
        ids = list(context)[-(self._max_length - max_gen) :] or [self.bos_id]
        new: list[int] = []
        text = ""
        for _ in range(max_gen):
            nxt = int(self._logprobs([ids + new])[0, -1].argmax())
            if nxt == self.eos_id:
                break
            new.append(nxt)
            text = self.tok_decode(new)
            if any(u and u in text for u in until):
                break
        for u in until:
            if u:
                text = text.split(u)[0]
        return text

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in [r.args for r in requests]:
            kw = dict(gen_kwargs or {})
            until = kw.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_gen = int(kw.get("max_gen_toks", self._max_gen_toks))
            text = self.greedy(self.tok_encode(context), until, max_gen)
            out.append(text)
            if self.cache_hook is not None:
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

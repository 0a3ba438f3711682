"""Progress of a training as plain log lines, for a job whose stderr is a file (Slurm ``.out``,
nohup, CI), where a progress bar would print nothing useful.

One line every ``every`` updates or every ``interval_s`` seconds, whichever comes first, plus the
first and the last update, through the ``logging`` logger ``scaling.progress`` (so a user can
redirect, silence or reformat it with the standard logging configuration)::

    iter 200/1,950 tokens 3.3M/31.9M budget 2/4 trunk loss 4.120 val 4.200 tok/s 5,120 mfu 0.31
        mem 41.2GB eta 1h12m       (one line)

The trainer calls its progress callback on rank 0 only, so only rank 0 prints. The ETA is the
tokens still to train divided by the token rate measured in this process (elapsed wall time
over tokens trained since it started, so a resumed run does not count the work done before).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

LOGGER = "scaling.progress"
log = logging.getLogger(LOGGER)


@dataclass(frozen=True)
class Progress:
    """What the trainer reports after each update.

    tokens_done / tokens_total   tokens trained so far / in the whole run (trunk and cooldowns)
    iter / total_iters           optimizer updates so far / in the whole run
    budget / n_budgets           the budget being trained towards (0-based) / how many
    branch                       the open cooldown branch (a budget index), None on the trunk
    peak_mem_bytes               peak device memory (CUDA) or max RSS (CPU), see metrics.py
    """

    run: str
    tokens_done: int
    tokens_total: int
    tokens_per_s: float | None = None
    train_loss: float | None = None
    val_loss: float | None = None
    iter: int = 0
    total_iters: int = 0
    budget: int | None = None
    n_budgets: int = 0
    branch: int | None = None
    mfu: float | None = None
    peak_mem_bytes: int | None = None

    @property
    def phase(self) -> str:
        """"trunk" or "cooldown k" (the budget index, 1-based, whose cooldown branch runs)."""
        return "trunk" if self.branch is None else f"cooldown {self.branch + 1}"


def _tokens(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def eta_text(seconds: float | None) -> str:
    """Seconds as 1h12m, 3m05s or 42s; '-' when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_line(p: Progress, eta_s: float | None) -> str:
    """The one-line summary of a :class:`Progress` (see the module docstring)."""
    parts = [f"iter {p.iter:,}/{p.total_iters:,}",
             f"tokens {_tokens(p.tokens_done)}/{_tokens(p.tokens_total)}"]
    if p.budget is not None and p.n_budgets:
        parts.append(f"budget {p.budget + 1}/{p.n_budgets}")
    parts.append(p.phase)
    if p.train_loss is not None:
        parts.append(f"loss {p.train_loss:.3f}")
    if p.val_loss is not None:
        parts.append(f"val {p.val_loss:.3f}")
    if p.tokens_per_s is not None:
        parts.append(f"tok/s {p.tokens_per_s:,.0f}")
    if p.mfu is not None:
        parts.append(f"mfu {p.mfu:.2f}")
    if p.peak_mem_bytes is not None:
        parts.append(f"mem {p.peak_mem_bytes / 1e9:.1f}GB")
    parts.append(f"eta {eta_text(eta_s)}")
    return " ".join(parts)


class ProgressLog:
    """A progress callback that logs a line every ``every`` updates or ``interval_s`` seconds."""

    def __init__(self, every: int = 100, interval_s: float = 60.0, *,
                 clock: Callable[[], float] = time.monotonic, logger: logging.Logger | None = None):
        self.every = max(1, int(every))
        self.interval_s = float(interval_s)
        self.clock = clock
        self.log = logger or log
        self._start: tuple[float, int] | None = None
        self._last_t = -math.inf
        self._last_iter = -1

    def eta(self, p: Progress) -> float | None:
        if self._start is None:
            return None
        t0, tok0 = self._start
        dt, dtok = self.clock() - t0, p.tokens_done - tok0
        if dt <= 0 or dtok <= 0:
            return None
        return (p.tokens_total - p.tokens_done) * dt / dtok

    def __call__(self, p: Progress) -> None:
        now = self.clock()
        if self._start is None:
            self._start = (now, p.tokens_done)
            self.log.info("%s: %s, %d budget(s), %s tokens to train", p.run,
                          "resuming at iter %d" % p.iter if p.iter else "starting", p.n_budgets,
                          _tokens(p.tokens_total - p.tokens_done))
            self._last_t = now
            return
        last = p.total_iters and p.iter >= p.total_iters
        due = p.iter % self.every == 0 or now - self._last_t >= self.interval_s
        if (due or last) and p.iter != self._last_iter:
            self.log.info("%s", format_line(p, 0.0 if last else self.eta(p)))
            self._last_t, self._last_iter = now, p.iter

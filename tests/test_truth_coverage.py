"""Interval coverage of approach 3 against planted laws (slow: each study is a bootstrapped fit).

Truth: every study draws losses from one Chinchilla law (E 1.8, A 480, alpha 0.35, B 2100,
beta 0.37) on a 7 x 7 grid of N and D, with 1% log-normal noise per point; the true parameters
and the true compute-optimal exponent a = beta / (alpha + beta) (F = 6 N) are known. A nominal 95%
bootstrap interval should cover each in about 95% of studies; with 40 studies the floor of 85%
(34 of 40) fails a true 95% coverage with probability 0.34% (binomial), and passes a true 80% with
29%. The studies are seeded: the outcome is fixed, not drawn anew each run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from scaling.fitting.fit import fit_law
from scaling.fitting.holdout import holdout
from scaling.fitting.laws import get_law

pytestmark = pytest.mark.slow

CHIN = get_law("chinchilla")
TRUE = {"E": 1.8, "A": 480.0, "alpha": 0.35, "B": 2100.0, "beta": 0.37}
A_TRUE = TRUE["beta"] / (TRUE["alpha"] + TRUE["beta"])
STUDIES, RESAMPLES, FLOOR = 40, 100, 34


def _study(seed: int, noise: float = 0.01) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    N, D = (g.ravel() for g in np.meshgrid(np.geomspace(1e7, 1e9, 7), np.geomspace(1e9, 1e11, 7)))
    loss = CHIN.predict(TRUE, N=N, D=D) * np.exp(noise * rng.standard_normal(N.size))
    return pd.DataFrame({"group": "g", "run": [f"r{i}" for i in range(N.size)], "N": N, "D": D,
                         "loss": loss, "flops": 6 * N * D, "flops_per_token": np.nan, "sparsity": np.nan})


def test_bootstrap_intervals_cover_the_planted_parameters_and_exponent():
    """40 planted studies, 100 resamples each: E, alpha, beta and a each covered in >= 34 of 40
    (measured 2026-12-07: E 38, alpha 40, beta 38, a 40)."""
    hits = {"E": 0, "alpha": 0, "beta": 0, "a": 0}
    for s in range(STUDIES):
        fit = fit_law(_study(s), CHIN, group="g", n_bootstrap=RESAMPLES, seed=s)
        for key in hits:
            lo, hi = fit.ci[key]
            truth = A_TRUE if key == "a" else TRUE[key]
            hits[key] += bool(lo <= truth <= hi)
    assert all(h >= FLOOR for h in hits.values()), hits


def test_holdout_prediction_intervals_cover_the_planted_losses():
    """Fit on the six smaller sizes, predict the 7 noisy losses of the largest (N = 1e9): over 30
    studies, 210 predictions, at least 88% inside the 95% prediction interval (a true 95% falls
    below that with probability 2e-5; a true 85% passes with 12%). Measured 2026-12-07: 199 of 210,
    94.8%."""
    inside = total = 0
    for s in range(30):
        res = holdout(_study(100 + s), CHIN, "N>5e8", n_bootstrap=RESAMPLES, seed=s)
        inside += int(res.heldout["inside"].sum())
        total += len(res.heldout)
    assert total == 210 and inside / total >= 0.88, (inside, total)

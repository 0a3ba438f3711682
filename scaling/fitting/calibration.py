"""Loss -> accuracy calibration (the law ``acc-sigmoid``) and the candidate's residual at matched loss.

The SMELT paper's MMLU figure fits downstream accuracy as a sigmoid of the validation loss on the
Baseline models and reports how far SMELT lies above that curve at its own loss. The law::

    acc(L) = floor + (1 - floor) * sigmoid(k * (L0 - L)),   sigmoid(z) = 1 / (1 + e^-z)

``floor`` is the accuracy of a model that knows nothing (chance: 1/4 for four choices), either
fixed (``floor=0.25``) or fitted in [0, 1); ``k`` > 0 is the steepness (per nat) and ``L0`` the loss
at which the model is half-way from the floor to 1. Fitted by least squares on the accuracies
(scipy ``least_squares``, trust-region reflective with bounds; starts on a grid of ``L0`` over the
observed losses and of ``k``; the best start kept).

The candidate's residual is ``mean_j (acc_j - acc_ref(L_j))`` over the candidate's points, with
``acc_ref`` the law fitted on the reference points: positive = the candidate is more accurate than
a reference model of the same loss. Its interval is a percentile bootstrap (Efron & Tibshirani
1993, ch. 13) that resamples the reference points (refitting the law) and the candidate points
independently, ``n_boot`` times (each refit starts at the full-data fit); it carries the scatter
of the points, not each accuracy's own sampling noise.

Identification: a sigmoid is identified only where the points span its rise. When every
accuracy sits at the floor (proxies score at chance), ``k`` runs to a bound or ``L0`` leaves the
observed losses; given the accuracies' standard errors (``ref_se``; the eval table's ``stderr``),
a reference whose accuracies span less than twice their median standard error is not identified
either (the rise is noise). The result says so (``identified`` False, with the reason) rather than
reporting a curve the data cannot determine. So are points at fewer distinct losses than the law
has free parameters (2 with a fixed floor, 3 with a fitted one), or all at one loss: they fix the
curve's height at those losses only, and other (k, L0) fit them exactly as well. An unidentified
law gets no residual interval (NaN; null in JSON).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from scaling.common.errors import UserError
from scaling.common.stats import percentile_interval, quantiles

LAW = "acc-sigmoid"
FORMULA = "acc = floor + (1 - floor) * sigmoid(k * (L0 - L))"
K_BOUNDS = (1e-3, 1e3)


# far beyond what a percentile interval needs (Efron & Tibshirani: 1,000-2,000 for 95%)
MAX_BOOT = 1_000_000

def acc_sigmoid(L: np.ndarray, floor: float, k: float, L0: float) -> np.ndarray:
    """floor + (1 - floor) / (1 + exp(-k (L0 - L))), computed without overflow."""
    z = k * (L0 - np.asarray(L, dtype=float))
    return floor + (1.0 - floor) * np.where(
        z >= 0, 1.0 / (1.0 + np.exp(-np.abs(z))), np.exp(-np.abs(z)) / (1.0 + np.exp(-np.abs(z)))
    )


@dataclass(frozen=True)
class SigmoidFit:
    """A fitted ``acc-sigmoid``: parameters, whether the floor was fixed, fit quality, identification."""

    floor: float
    k: float
    L0: float
    floor_fixed: bool
    n: int
    rmse: float
    identified: bool
    reason: str = ""
    law: str = LAW
    formula: str = FORMULA

    def predict(self, L: np.ndarray) -> np.ndarray:
        return acc_sigmoid(L, self.floor, self.k, self.L0)

    def to_dict(self) -> dict:
        return asdict(self)


def _check(L: np.ndarray, acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    L, acc = np.asarray(L, dtype=float), np.asarray(acc, dtype=float)
    if L.shape != acc.shape or L.ndim != 1:
        raise UserError("losses and accuracies must be two lists of equal length")
    if not (np.isfinite(L).all() and np.isfinite(acc).all()):
        raise UserError("losses and accuracies must be finite numbers")
    if ((acc < 0) | (acc > 1)).any():
        raise UserError("accuracies must lie in [0, 1]")
    return L, acc


def fit_acc_sigmoid(
    L: np.ndarray, acc: np.ndarray, floor: float | None = None, start: SigmoidFit | None = None
) -> SigmoidFit:
    """Least-squares ``acc-sigmoid`` on (loss, accuracy) points; ``floor`` None = fitted.

    Needs at least 3 points with a fixed floor, 4 with a fitted one. ``start``: a previous fit to
    start from alone (the bootstrap refits start at the full-data fit) instead of the grid.
    """
    from scipy.optimize import least_squares

    L, acc = _check(L, acc)
    n_params = 2 if floor is not None else 3
    if floor is not None and not 0 <= floor < 1:
        raise UserError(f"the floor must lie in [0, 1), got {floor}")
    if L.size < n_params + 1:
        raise UserError(
            f"{LAW} needs at least {n_params + 1} points ({'fixed' if floor is not None else 'free'} "
            f"floor), got {L.size}"
        )
    spread = float(L.max() - L.min())
    # the bounds on L0 need a width; a zero spread is reported as unidentified below
    span = spread or 1.0
    lo_L0, hi_L0 = float(L.min() - 5 * span), float(L.max() + 5 * span)

    def unpack(p):
        return (floor, p[0], p[1]) if floor is not None else (p[2], p[0], p[1])

    def resid(p):
        f, k, L0 = unpack(p)
        return acc_sigmoid(L, f, k, L0) - acc

    lb = [K_BOUNDS[0], lo_L0] + ([] if floor is not None else [0.0])
    ub = [K_BOUNDS[1], hi_L0] + ([] if floor is not None else [0.999])
    if start is not None:
        starts = [[float(np.clip(start.k, *K_BOUNDS)), float(np.clip(start.L0, lo_L0, hi_L0))]
                  + ([] if floor is not None else [float(np.clip(start.floor, 0.0, 0.999))])]
    else:
        starts = [[float(np.clip(k, *K_BOUNDS)), float(L0)]
                  + ([] if floor is not None else [float(np.clip(acc.min(), 0, 0.9))])
                  for L0 in quantiles(L, [0.1, 0.5, 0.9]) for k in (1.0 / span, 4.0 / span, 16.0 / span)]
    best = None
    for p0 in starts:
        r = least_squares(resid, p0, bounds=(lb, ub), method="trf", xtol=1e-12, ftol=1e-12, gtol=1e-12)
        if best is None or r.cost < best.cost:
            best = r
    f, k, L0 = unpack(best.x)
    rmse = float(np.sqrt(np.mean(best.fun**2)))
    reasons = []
    if k <= K_BOUNDS[0] * 1.01 or k >= K_BOUNDS[1] * 0.99:
        reasons.append(f"k at its bound ({k:.3g})")
    if not (L.min() - span <= L0 <= L.max() + span):
        reasons.append(f"L0 = {L0:.3g} far outside the observed losses [{L.min():.3g}, {L.max():.3g}]")
    if float(np.ptp(acc)) < 1e-12:
        reasons.append("every accuracy is equal")
    distinct = int(np.unique(L).size)
    if spread == 0 or distinct < n_params:
        # points at one loss fix only the curve's height there: every (k, L0) through that height
        # fits equally well, and a residual elsewhere depends on which one the optimizer stopped at
        reasons.append(f"{distinct} distinct loss value{'s' if distinct != 1 else ''} for {n_params} free "
                       "parameters")
    return SigmoidFit(
        floor=float(f),
        k=float(k),
        L0=float(L0),
        floor_fixed=floor is not None,
        n=int(L.size),
        rmse=rmse,
        identified=not reasons,
        reason="; ".join(reasons),
    )


@dataclass(frozen=True)
class Calibration:
    """The reference's fitted law and the candidate's mean residual at matched loss, with its
    bootstrap interval. ``points``: every point with its prediction and residual."""

    task: str
    metric: str
    reference: str
    candidate: str
    fit: SigmoidFit
    residual: float
    residual_lo: float
    residual_hi: float
    level: float
    n_boot: int
    n_reference: int
    n_candidate: int
    points: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fit"] = self.fit.to_dict()
        return d


def calibrate(
    ref_L: np.ndarray,
    ref_acc: np.ndarray,
    cand_L: np.ndarray,
    cand_acc: np.ndarray,
    *,
    floor: float | None = None,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    task: str = "",
    metric: str = "acc",
    reference: str = "baseline",
    candidate: str = "smelt",
    labels: tuple[list, list] | None = None,
    ref_se: np.ndarray | None = None,
) -> Calibration:
    """Fit ``acc-sigmoid`` on the reference and give the candidate's residual (see the module docstring)."""
    ref_L, ref_acc = _check(ref_L, ref_acc)
    cand_L, cand_acc = _check(cand_L, cand_acc)
    if cand_L.size < 1:
        raise UserError(f"no {candidate} points to compare")
    if not 0 <= n_boot <= MAX_BOOT:  # the resamples' results are held in memory at once
        raise UserError(f"the number of bootstrap resamples must be in [0, {MAX_BOOT:,}], got {n_boot}")
    fit = fit_acc_sigmoid(ref_L, ref_acc, floor)
    if ref_se is not None and np.isfinite(ref_se).any():
        noise = float(np.nanmedian(ref_se))
        if float(np.ptp(ref_acc)) < 2 * noise:
            why = (f"the {reference} accuracies span {float(np.ptp(ref_acc)):.3g}, less than twice their "
                   f"median standard error {noise:.3g}: no rise above noise")
            fit = replace(fit, identified=False, reason="; ".join(r for r in (fit.reason, why) if r))
    resid = cand_acc - fit.predict(cand_L)
    rng = np.random.default_rng(seed)
    boots = np.full(n_boot, np.nan)
    # an unidentified law gets no interval: resampling one of many equally good curves would give
    # a confident-looking interval around an arbitrary number
    for b in range(n_boot if fit.identified else 0):
        i = rng.integers(0, ref_L.size, ref_L.size)
        j = rng.integers(0, cand_L.size, cand_L.size)
        try:
            fb = fit_acc_sigmoid(ref_L[i], ref_acc[i], floor, start=fit)
        except UserError:
            continue
        boots[b] = float(np.mean(cand_acc[j] - fb.predict(cand_L[j])))
    lo, hi = percentile_interval(boots, level) if n_boot and fit.identified else (float("nan"), float("nan"))
    notes = []
    if not fit.identified:
        notes.append(
            f"the {LAW} law is not identified on the {reference} points ({fit.reason}): the residual "
            "measures distance from a curve the data do not determine, and has no interval"
        )
    lab_r, lab_c = labels or ([None] * ref_L.size, [None] * cand_L.size)
    points = [
        {"arch": arch, "label": lab, "loss": float(x), "value": float(y), "predicted": float(p),
         "residual": float(y - p)}
        for arch, labs, L, acc in ((reference, lab_r, ref_L, ref_acc), (candidate, lab_c, cand_L, cand_acc))
        for lab, x, y, p in zip(labs, L, acc, fit.predict(L))
    ]
    return Calibration(
        task=task,
        metric=metric,
        reference=reference,
        candidate=candidate,
        fit=fit,
        residual=float(np.mean(resid)),
        residual_lo=float(lo),
        residual_hi=float(hi),
        level=level,
        n_boot=n_boot,
        n_reference=int(ref_L.size),
        n_candidate=int(cand_L.size),
        points=points,
        notes=notes,
    )


def calibrate_table(
    df,
    task: str,
    metric: str = "acc",
    *,
    reference: str = "baseline",
    candidate: str = "smelt",
    x: str = "loss",
    floor: float | None = None,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Calibration:
    """``calibrate`` on an evaluation table (``smelt-scale eval --out``): the rows of ``task`` and
    ``metric``, x = column ``x`` (default the run's validation loss), y = ``value``, split by ``arch``."""
    import pandas as pd

    for col in ("arch", "task", "metric", "value", x):
        if col not in df.columns:
            raise UserError(f"the evaluation table has no column {col!r}")
    rows = df[(df["task"] == task) & (df["metric"] == metric)]
    if rows.empty:
        have = sorted({f"{t}/{m}" for t, m in zip(df["task"], df["metric"])})
        raise UserError(
            f"no rows of task {task!r}, metric {metric!r}; the table has {', '.join(have[:12])}"
        )
    for col in (x, "value"):
        num = pd.to_numeric(rows[col], errors="coerce")
        if (num.isna() & rows[col].notna()).any() or rows[col].map(lambda v: isinstance(v, bool)).any():
            bad = rows[col][num.isna() & rows[col].notna()]
            example = bad.iloc[0] if len(bad) else True
            raise UserError(f"column {col!r} of the evaluation table holds {str(example)[:30]!r}, "
                            "not a number")
        rows = rows.assign(**{col: num.astype(float)})
    keys = [c for c in ("run", "budget_index", "num_fewshot", "backend") if c in rows.columns]
    if {"run", "budget_index"} <= set(keys):
        # the same model's score twice (a table concatenated with itself) would count as two points
        dup = rows[rows.duplicated(keys, keep=False)]
        if len(dup):
            r = dup.iloc[0]
            raise UserError(f"the evaluation table holds {task}/{metric} of run {r['run']!r} at budget "
                            f"{r['budget_index']} more than once ({len(dup)} such rows): one row per "
                            "(run, budget) and setting")
    ref, cand = rows[rows["arch"] == reference], rows[rows["arch"] == candidate]
    for arch, part in ((reference, ref), (candidate, cand)):
        if part.empty:
            have = ", ".join(sorted(map(str, rows["arch"].unique())))
            raise UserError(f"no rows of architecture {arch!r} for {task}/{metric}; architectures: {have}")

    def label(r):
        return f"{r.get('run', '')}:{r.get('budget_index', '')}"

    return calibrate(
        ref[x].to_numpy(float),
        ref["value"].to_numpy(float),
        cand[x].to_numpy(float),
        cand["value"].to_numpy(float),
        floor=floor,
        n_boot=n_boot,
        level=level,
        seed=seed,
        task=task,
        metric=metric,
        reference=reference,
        candidate=candidate,
        labels=([label(r) for _, r in ref.iterrows()], [label(r) for _, r in cand.iterrows()]),
        ref_se=pd.to_numeric(ref["stderr"], errors="coerce").to_numpy(float) if "stderr" in ref else None,
    )

# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Compute savings of SMELT over Baseline on the compute-optimal frontier
#
# From the two fitted laws (notebook 02; 50 bootstrap resamples here), `scaling.fitting.savings` minimises each
# law along a training budget C = F(N)·D (F(N) = k·N + e·√N + c fitted to each architecture's FLOPs
# per token) to get the frontier L*(C), and asks, in the SMELT paper's convention, how much compute the Baseline needs
# to reach the loss SMELT reaches with C: savings = 1 − C / C_Baseline. Intervals pair the two
# architectures' bootstrap resamples.
#
# The runs are **CPU proxies** trained with at most about 3.6·10^12 FLOPs. Every number at a larger
# budget is an **extrapolation** of a law fitted over one decade of compute, and the figures shade
# it; 10^21 FLOPs (the paper's headline budget) lies about 8.4 decades beyond the data. The paper's own laws
# (`--law-set paper`, fitted on 1.3e19–2.2e21 FLOPs) are drawn beside ours for orientation, not as a
# target.

# %%
# %matplotlib inline
from pathlib import Path

import numpy as np
import pandas as pd

from scaling import plots
from scaling.fitting.envelope import figure_budgets, observed_savings
from scaling.fitting.fit import fit_groups
from scaling.fitting.reference_laws import load_law_set
from scaling.fitting.savings import FittedLaw, savings, withhold_unidentified
from scaling.fitting.savings_sweep import savings_over
from scaling.fitting.tables import load_points

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "pyproject.toml").is_file())
RUNS = ROOT / "runs"
BOOTSTRAP = 50
pd.set_option("display.precision", 4)
pd.set_option("display.width", 160)

points = load_points(RUNS)
fits = fit_groups(points, "chinchilla", n_bootstrap=BOOTSTRAP, seed=0, cross_checks=False)
base, smelt = FittedLaw.from_fit(fits["baseline"]), FittedLaw.from_fit(fits["smelt"])
data_range = (min(base.compute_min, smelt.compute_min), max(base.compute_max, smelt.compute_max))
print(f"fitted compute: {data_range[0]:.3g} to {data_range[1]:.3g} FLOPs "
      f"({np.log10(data_range[1] / data_range[0]):.2f} decades); everything above {data_range[1]:.3g} "
      "is extrapolation")

# %% [markdown]
# ## The frontiers
# Left: L*(C) with its 95% bootstrap band, the fitted points (hollow) at their recorded FLOPs, and the
# fitted irreducible loss E (dotted). Right: the optimal size N* and tokens D*. The dotted vertical
# lines mark the data; the shaded sides are extrapolation.

# %%
plots.frontier(fits, points)

# %% [markdown]
# ## Savings against the budget
# Left: savings with the 95% paired-bootstrap interval (an interval far outside the axes is cut at
# them); grey dashed: the paper's two laws at its three sparsities. Right: the loss gap
# L*_Baseline − L*_SMELT at equal compute (positive: SMELT better). Where a law is not identified
# its curve is only dashed (its shape, not a result), and inside the data the diamonds give what
# `smelt-scale savings` answers there instead: the savings between the observed loss-compute
# frontiers of the runs (`scaling.fitting.envelope`, no law), with their bootstrap intervals over
# run pairs.

# %%
budgets = np.logspace(11, 22, 45)
result, left_out = savings_over(base, smelt, budgets)
result = withhold_unidentified(result, base, smelt, extrapolate=True)   # far rows marked, not dropped
identified = not (base.unidentified or smelt.unidentified)
observed = observed_savings(points, RUNS, "baseline", "smelt", figure_budgets(*data_range),
                            n_bootstrap=BOOTSTRAP, seed=0)
paper = load_law_set("paper")
paper_result = savings(paper.fitted("baseline"), paper.fitted("smelt"), np.logspace(19, 22, 13),
                       sparsities=paper.sparsities)
if left_out:
    print(f"left out {len(left_out)} budgets the bisection cannot answer: {left_out[0][1]}")
plots.savings(result, data_range=data_range, reference=paper_result, mark=1e21, observed=observed,
              laws_identified=identified)

# %% [markdown]
# Inside the data, the observed frontiers (law-free; no number where one frontier never reaches the
# other's loss):

# %%
pd.DataFrame([{"budget": r.budget, "savings": r.savings, "savings_ci": r.savings_ci, "loss_gap": r.loss_gap,
               "reason": r.reason or ""} for r in observed])

# %% [markdown]
# ## The numbers
# At the largest fitted compute (the end of the data), one and two decades beyond it, and at the
# paper's 1e20 and 1e21. `extrapolation_decades` counts decades beyond the largest fitted compute;
# `tokens_per_param` is D*/N* of the Baseline at the budget.

# %%
marks = [data_range[1], 10 * data_range[1], 100 * data_range[1], 1e20, 1e21]
where = dict(zip(marks, ["end of data", "+1 decade", "+2 decades", "1e20", "1e21"]))
# as `smelt-scale savings` does: no point estimate from an unidentified law more than a decade out,
# and a budget where the two frontiers never meet gets its reason instead of a number
answered, unmatched = savings_over(base, smelt, marks)
at = withhold_unidentified(answered, base, smelt)
rows = [r.to_dict() for r in at.rows] + [{"budget": c, "savings": None, "reason": why} for c, why in unmatched]
if not identified:   # inside the data `smelt-scale savings` lets the observed frontiers answer, not the laws
    rows = [r if r["budget"] != data_range[1] else
            {"budget": r["budget"], "savings": None, "extrapolation_decades": r["extrapolation_decades"],
             "reason": "laws not identified: inside the data the observed frontiers answer (table above)"}
            for r in rows]
table = pd.DataFrame(rows).sort_values("budget").reindex(
    columns=["budget", "savings", "savings_ci", "loss_gap", "candidate_loss", "reference_compute",
             "tokens_per_param", "candidate_tokens_per_param", "extrapolation_decades", "reason"])
table.insert(0, "where", [where[b] for b in table["budget"]])
table

# %%
r21 = table[table["budget"] == 1e21].iloc[0]
if r21["savings"] is None or not np.isfinite(r21["savings"]):
    print(f"Savings at 1e21 FLOPs: no estimate. {r21['reason']}")
else:
    print(f"Savings at 1e21 FLOPs (SMELT's budget, the paper's convention): {100 * r21['savings']:.1f}% "
          f"(95% CI {100 * r21['savings_ci'][0]:.1f} to {100 * r21['savings_ci'][1]:.1f}%), "
          f"{r21['extrapolation_decades']:.1f} decades beyond the data.")
end = table[table["budget"] == data_range[1]].iloc[0]
if identified and end["savings"] is not None and np.isfinite(end["savings"]):
    print(f"At the end of the data ({data_range[1]:.3g} FLOPs), from the laws: {100 * end['savings']:.1f}% "
          f"(95% CI {100 * end['savings_ci'][0]:.1f} to {100 * end['savings_ci'][1]:.1f}%).")
for w in at.warnings:
    print("warning:", w)
for g, f in fits.items():
    d = f.diagnostics
    if d["on_bound"]:
        print(f"{g}: the fit sits on a bound of {', '.join(d['on_bound'])}"
              + (f" (E = {f.params['E']:.2g}: the law has no loss floor, so its frontier keeps falling like a "
                 "pure power law and the losses it extrapolates to 1e20-1e21 are not physical)"
                 if "E" in d["on_bound"] else ""))
    if not d["identified"]:
        print(f"{g}: not identified by these runs ({'; '.join(d['warnings'])})")

# %% [markdown]
# ## For orientation: the paper's laws
# The SMELT paper's published fits (reading notes of arXiv 2609.01343 v1; `scaling/resources/paper_laws.json`)
# give 6.8–10.0% at 1e20 and 14.7–18.0% at 1e21 across its three sparsities. They were fitted on
# models 10^5 times larger than these proxies, in a different law form; the two sets of numbers
# answer the same question at very different scales.

# %%
pd.DataFrame([{"budget": r.budget, "sparsity": r.sparsity, "savings": r.savings,
               "tokens_per_param": r.tokens_per_param} for r in paper_result.rows
              if np.isclose(np.log10(r.budget), [20, 21]).any()])

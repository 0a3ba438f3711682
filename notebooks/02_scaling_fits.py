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
# # 02 · Scaling-law fits of Baseline and SMELT
#
# One Chinchilla-form law per architecture, L(N, D) = E + A/N^α + B/D^β, fitted to the shipped runs
# (N = active non-embedding parameters, D = training tokens, L = validation loss in nats/token) by
# `scaling.fitting.fit` (Hoffmann et al. 2022 approach 3 as corrected by Besiroglu et al. 2024: Huber loss on
# log L, multi-start L-BFGS) with a bootstrap over runs (50 resamples here to keep the notebook fast;
# `smelt-scale fit runs/` uses 200).
#
# The runs are **CPU proxies** (4·10^3–4·10^5 active parameters, 256-token context; the IsoFLOP study of
# `runs/README.md`). The data span the
# sizes and token budgets in the table below; the law curves run a little past them (a factor 1.6 in
# the fit panels, 2.5 in the IsoFLOP panels, 3 in compute for N*(C)) only to show their shape. What
# the laws predict for the paper's tiers is extrapolation by many decades (notebook 03).

# %%
# %matplotlib inline
from pathlib import Path

import numpy as np
import pandas as pd

from scaling import plots
from scaling.fitting.fit import fit_groups
from scaling.fitting.slices import isoflop_slices
from scaling.fitting.tables import load_points, total_flops

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "pyproject.toml").is_file())
RUNS = ROOT / "runs"
BOOTSTRAP = 50
pd.set_option("display.precision", 4)
pd.set_option("display.width", 160)

points = load_points(RUNS)
fits = fit_groups(points, "chinchilla", n_bootstrap=BOOTSTRAP, seed=0)

# %% [markdown]
# ## The data

# %%
points.assign(C=total_flops(points)).groupby("group").agg(
    points=("loss", "size"), runs=("run", "nunique"), N_min=("N", "min"), N_max=("N", "max"),
    D_min=("D", "min"), D_max=("D", "max"), C_min=("C", "min"), C_max=("C", "max"),
    loss_min=("loss", "min"), loss_max=("loss", "max"))

# %% [markdown]
# ## Fitted parameters with bootstrap intervals
# 95% percentile intervals over run resamples; a = β/(α+β) and b = α/(α+β) are the compute-optimal
# exponents (N* ∝ C^a, D* ∝ C^b). The diagnostics say whether the fit is identified (no parameter on a
# bound, the best starts agree, few bootstrap fits on a bound).

# %%
rows = []
for g, f in fits.items():
    for name, value in [*f.params.items(), *f.derived.items()]:
        lo, hi = f.ci.get(name, (np.nan, np.nan))
        rows.append({"group": g, "parameter": name, "estimate": value, "ci_low": lo, "ci_high": hi})
pd.DataFrame(rows).pivot(index="parameter", columns="group", values=["estimate", "ci_low", "ci_high"]).reindex(
    [*next(iter(fits.values())).params, *next(iter(fits.values())).derived])

# %%
for g, f in fits.items():
    print(f.summary(), "\n")

# %% [markdown]
# ## Data and fitted law
# Left: loss against tokens at each size; right: loss against size at each token budget. Markers are
# the fitted points (every seed where there are several); lines are the fitted law.

# %%
plots.fits(points, fits)

# %% [markdown]
# ## Residuals
# log L − log L̂ per point; 0.01 is a 1% error. Structure in D or N (rather than scatter) means the law
# form does not describe these runs well.

# %%
plots.residuals(points, fits)

# %% [markdown]
# ## IsoFLOP profiles (approach 2) and the compute-optimal size
# The study trains each size to the token counts of up to five IsoFLOP budgets (D = C/F), so the sizes
# share those computes; the profiles read each run's loss at fixed training FLOPs off its budget
# points (interpolated in log–log, inside each run's range only). Dashed: a parabola in log N through them, its vertex (diamond) where
# it is convex with the minimum inside the sampled sizes; solid: the fitted law along the same
# compute, its minimum a star. Right: N*(C) of the law with C = F(N)·D, F(N) = k·N + e·√N + c fitted
# to the runs' FLOPs per token (the frontier the savings use), and the vertices.

# %%
plots.isoflop(isoflop_slices(points), points, fits)

# %%
for g, f in fits.items():
    fpn = (total_flops(points[points["group"] == g]) / (points.loc[points["group"] == g, "N"]
                                                          * points.loc[points["group"] == g, "D"]))
    print(f"{g}: FLOPs/(N·D) runs from {fpn.min():.3g} to {fpn.max():.3g} across sizes (attention and the "
          f"LM head weigh heavily at these sizes), so the frontier uses F(N) = {f.cost.describe()} "
          f"(worst error {100 * f.cost.max_rel_error:.2g}% on the runs), not one k")

# %% [markdown]
# ## Cross-checks: approaches 1 and 2 of the fitter
# What `smelt-scale fit` prints beside approach 3 (on the points as they are, without interpolation).

# %%
for g, f in fits.items():
    key = "a_data" if "a_data" in f.derived else "a"   # the exponent across the data's compute
    print(f"{g}: approach 3 a = {f.derived[key]:.3f} [{f.ci[key][0]:.3f}, {f.ci[key][1]:.3f}] "
          f"(large-budget limit {f.derived['a']:.3f})")
    for key in ("approach1", "approach2"):
        c = f.cross_checks[key]
        if not c.get("available"):
            print(f"   {c.get('method', key)}: not available ({c['reason']})")
            continue
        lo, hi = c["a_ci"]
        ci = f"[{lo:.3f}, {hi:.3f}]" if np.isfinite([lo, hi]).all() else "no interval"
        details = [c["mode"]] if key == "approach1" else [f"{c['n_buckets']} budgets"]
        if "resampled_share" in c:
            details.append(f"an estimate in {c['resampled_share']:.0%} of the seed resamples")
        if "a_cubic" in c:  # the window parabola's shape check: cubics through the same points
            clo, chi = c["a_cubic_ci"]
            details.append(f"cubics through the same points {c['a_cubic']:.3f} [{clo:.3f}, {chi:.3f}]")
        print(f"   {c.get('method', key)}: a = {c['a']:.3f} {ci} ({'; '.join(details)})")
    for w in f.cross_checks.get("warnings", []):
        print(f"   warning: {w}")

# %% [markdown]
# ## Parameter intervals
# Estimate (large marker), 95% bootstrap interval (bar) and every bootstrap resample (dots); A and B
# on log axes. Wide or bound-hugging clouds mean a parameter is weakly identified by these runs.

# %%
plots.params(fits)

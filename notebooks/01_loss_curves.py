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
# # 01 · Training and validation curves of the shipped runs
#
# The runs in `runs/` come from `plans/isoflop-study.toml` and its three seed plans
# (`plans/isoflop-study-seeds.toml`, `isoflop-topseeds-seeds.toml`, `isoflop-d04seeds-seeds.toml`): nine
# **CPU proxy** sizes (4·10^3–4·10^5 active parameters, 4 layers, top-2 of 8 experts, 256-token context,
# a peak lr per width, trained in fp32 on two CPU cores; `runs/README.md`),
# each as a Baseline MoE and as its compute-matched SMELT twin (middle half of the layers looped
# twice; same FLOPs per token, non-embedding parameters and KV cache). These are proxies: scaling at
# this size need not carry over to the paper's 100M–1.6B-active tiers.
#
# Every run trains one warmup-stable-decay (WSD) trunk to its largest token budget and branches off a
# short cooldown for each smaller budget; the validation loss at the end of each budget (on 200 fixed
# held-out windows) is one (N, D, loss) point of the scaling fits in notebook 02.

# %%
# %matplotlib inline
from pathlib import Path

import numpy as np
import pandas as pd

from scaling import plots
from scaling.fitting.curves import read_curves
from scaling.fitting.tables import load_points

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "pyproject.toml").is_file())
RUNS = ROOT / "runs"
pd.set_option("display.precision", 4)
pd.set_option("display.width", 160)

curves = read_curves(RUNS)
points = load_points(RUNS)

# %% [markdown]
# ## The runs
# One row per run: its size N (active non-embedding parameters, what the fits use), training FLOPs
# per token F, the budgets it has finished and whether it is complete.

# %%
runs = (curves.groupby("run")
        .agg(tier=("tier", "first"), arch=("arch", "first"), N=("N", "first"), F=("flops_per_token", "first"),
             budgets_done=("budget_index", "count"), tokens=("tokens", "max"), complete=("complete", "first"))
        .sort_values(["N", "arch"]))
runs["F/N"] = runs["F"] / runs["N"]
runs

# %% [markdown]
# ## Loss against training tokens
# One panel per tier, Baseline (blue) and SMELT (vermillion) overlaid. Thin lines: training loss
# (running mean of 5 steps) on the trunk (light) and on the cooldown branches (full colour); filled
# markers: validation at the end of each token budget (the fitted points; these runs validate only
# there). Both axes are measured: nothing here is extrapolated.

# %%
plots.loss_curves(curves, x="tokens")

# %% [markdown]
# ## Loss against training compute
# The same curves against training FLOPs (F × tokens, the exact per-token count of `scaling.accounting.costs`).
# Within a tier the two architectures spend the same FLOPs per token, so at equal tokens they have
# spent equal compute.

# %%
plots.loss_curves(curves, x="flops")

# %% [markdown]
# ## SMELT − Baseline at each budget, beside the seed-to-seed spread
# Validation loss at each budget's end, averaged over seeds; `gap` = SMELT − Baseline (negative:
# SMELT better). Every tier has several seeds (3 at every budget, 7 for d_model 6–56 at the three
# smallest budgets);
# `seed spread` is the larger of the two architectures' max − min over seeds at that budget: the range
# of single runs. A mean over n seeds varies far less (its s.d. is the seeds' s.d. / sqrt(n)); the
# paired test with intervals is `smelt-scale compare runs/`.

# %%
pts = points.merge(curves.groupby("run")[["tier"]].first(), left_on="run", right_index=True)
pts["tokens (k)"] = (pts["D"] / 1e3).round().astype(int)
keys = ["tier", "tokens (k)"]
mean = pts.pivot_table(index=keys, columns="group", values="loss", aggfunc="mean")
spread = pts.groupby([*keys, "group"])["loss"].agg(lambda s: s.max() - s.min() if len(s) > 1 else np.nan)
table = mean.copy()
table["gap"] = mean["smelt"] - mean["baseline"]
table["seed spread"] = spread.groupby(keys).max()
order = pts.groupby("tier")["N"].max().sort_values().index
table = table.reindex(order, level="tier")
table

# %%
print(f"{len(points)} fitted points from {points['run'].nunique()} runs; "
      f"SMELT better (gap < 0) at {int((table['gap'] < 0).sum())} of {int(table['gap'].notna().sum())} "
      f"(tier, budget) cells; mean gap {table['gap'].mean():+.4f} nats/token.")

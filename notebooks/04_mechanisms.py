# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Mechanisms: attention sink per pass, gain by length, in-context learning on Dyck
#
# The SMELT paper explains its gain with three measurements; `smelt-scale analyze` makes each of
# them on trained runs and saves the result next to the run (`runs/<run>/analysis/*.json`). This
# notebook reads those files (it recomputes nothing) for the shipped Baseline/SMELT pair with final
# weights of the first CPU sweep, `runs-cpu-proxy-2026-12-02/proxy-s-baseline-s0` and
# `runs-cpu-proxy-2026-12-02/proxy-s-smelt-s0` (`runs/` now holds the IsoFLOP study, whose runs keep
# no weights): **CPU proxies** with about 1.5·10^5 active parameters, a 256-token context and
# 2·10^6 training tokens, so the paper's numbers (from 100M–1.6B-active models with 4096-token
# contexts) are a reference point, not an expectation.
#
# To (re)compute the saved results:
#
# ```bash
# smelt-scale analyze sink    runs-cpu-proxy-2026-12-02/proxy-s-baseline-s0 runs-cpu-proxy-2026-12-02/proxy-s-smelt-s0
# smelt-scale analyze sink    runs-cpu-proxy-2026-12-02/proxy-s-baseline-s0 runs-cpu-proxy-2026-12-02/proxy-s-smelt-s0 --probe dyck
# smelt-scale analyze lengths runs-cpu-proxy-2026-12-02/proxy-s-baseline-s0 runs-cpu-proxy-2026-12-02/proxy-s-smelt-s0
# smelt-scale analyze icl     runs-cpu-proxy-2026-12-02/proxy-s-baseline-s0 runs-cpu-proxy-2026-12-02/proxy-s-smelt-s0
# ```

# %%
# %matplotlib inline
from pathlib import Path

import pandas as pd
from IPython.display import display

from scaling import plots
from scaling.analysis import KINDS, saved_analyses

ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "pyproject.toml").is_file())
RUNS = ROOT / "runs-cpu-proxy-2026-12-02"  # the first CPU sweep: the pair with final weights
pd.set_option("display.precision", 4)
pd.set_option("display.width", 160)

saved = {kind: [r for _, r in saved_analyses(RUNS, kind)] for kind in KINDS}


def missing(kind: str) -> None:
    extra = " --probe dyck" if kind == "sink_dyck" else ""
    command = "sink" if kind.startswith("sink") else "lengths" if kind.startswith("lengths") else kind
    print(f"NO SAVED RESULT: no */analysis/{kind}.json under {RUNS}. Compute it with\n"
          f"  smelt-scale analyze {command} {RUNS.name}/proxy-s-baseline-s0 {RUNS.name}/proxy-s-smelt-s0{extra}")


for kind, results in saved.items():
    print(f"{kind:>13}: " + (", ".join(sorted({r.run if hasattr(r, 'run') else r.smelt for r in results}))
                             if results else "none saved"))

# %% [markdown]
# ## 1. Attention sink per layer pass
# Mean attention mass on the BOS position (and on everything else) for every layer *pass*: a looped
# SMELT layer runs twice and reports both passes (L<layer>·1, L<layer>·2, shaded). Validation documents,
# every query position t ≥ 1. The paper, on its Dyck probe: BOS mass about 0.60 on the first pass and
# 0.02 on the second.

# %%
if saved["sink"]:
    display(plots.sink(saved["sink"]))
    display(pd.concat([r.to_frame() for r in saved["sink"]], ignore_index=True))
else:
    missing("sink")

# %% [markdown]
# The paper's probe itself: k-shot Dyck prompts, attention from the query line, with the mass on the
# demonstration answers split out (paper: 0.24 on the first pass, 0.85 on the second).

# %%
if saved["sink_dyck"]:
    display(plots.sink(saved["sink_dyck"]))
    display(pd.concat([r.to_frame() for r in saved["sink_dyck"]], ignore_index=True))
else:
    missing("sink_dyck")

# %% [markdown]
# ## 2. Loss and SMELT's gain by sample length and token position
# Top: validation loss by document length (buckets adapted to the 256-token context) and by position
# in the window. Bottom: the gain L_Baseline − L_SMELT per bucket with ±1 paired standard error
# (positive: SMELT better); the shaded buckets are the "long" documents (≥ T/8, the paper's 512–4096
# at T = 4096). The paper: the gain on long samples is about 1.52× that on short ones.

# %%
if saved["lengths"]:
    names = {r.run for r in saved["lengths"]}
    gain = next((g for g in saved["lengths_gain"] if g.baseline in names and g.smelt in names), None)
    display(plots.lengths(saved["lengths"], gain))
    if gain is not None:
        display(gain.to_frame()[["by", "lo", "hi", "n_tokens", "baseline_loss", "smelt_loss", "gain", "gain_se",
                                 "rel_gain"]])
        print(gain.summary().splitlines()[-1].strip())
        pools = {side: sum(g.n_tokens for g in gain.buckets if g.by == "length"
                           and (g.lo >= gain.long_from) == (side == "long")) for side in ("short", "long")}
        print(f"tokens behind that ratio: {pools['short']} in documents shorter than {gain.long_from} tokens, "
              f"{pools['long']} in longer ones"
              + (": too few short-document tokens for the long/short ratio to mean anything"
                 if pools["short"] < 1000 else ""))
    else:
        missing("lengths_gain")
else:
    missing("lengths")

# %% [markdown]
# ## 3. In-context learning: Dyck completion with k demonstrations
# Exact-match accuracy of closing the open brackets, greedy decoding, with a 95% Wilson interval; k as
# far as the 256-token context allows. The paper, 32 shots: SMELT 29.8%, Baseline 26.4%.

# %%
if saved["icl"]:
    display(plots.icl(saved["icl"]))
    display(pd.concat([r.to_frame() for r in saved["icl"]], ignore_index=True))
else:
    missing("icl")

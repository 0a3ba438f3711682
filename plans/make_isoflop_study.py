"""Write the IsoFLOP proxy study's sweep plans (issue 26; docs/proxy-study.md).

    python plans/make_isoflop_study.py            # writes plans/isoflop-study.toml and
                                                  # plans/isoflop-study-seed1.toml

Why a script and not `smelt-scale plan` alone: `plan` proposes one set of sizes per budget, each
size trained once per budget. Here one size grid serves all three budgets: a size's single WSD
trunk branches a cooldown at each budget's token count D = C / F (F = the Baseline config's
exact training FLOPs per token, `scaling.accounting.costs`), so 7 sizes x 3 budgets cost about
5 runs at the largest budget instead of 15 separate runs. The sizes are the ones `plan` builds
(`scaling.design.sizing.scaled_baseline`: the proxy-xxs shape with d_model and expert_hidden
scaled, width multiple 1); each SMELT run is the matcher's twin of its Baseline
(`scaling.accounting.matching.smelt_twin`, as `smelt-scale sweep` derives it) and trains the
same tokens.

Every size branches at each budget it passes (up to its LAST_BUDGET) where D = C / F is at least
MIN_TOKENS; this gives 6-8 sizes per budget and architecture. A second seed of every size trains to the second
budget, branching at the first: the seed-to-seed noise at two budgets.

Learning rate per size: lr(d) = LR_AT_6 * (d_model / 6) ** -LR_EXPONENT, fitted on the lr
sweep (plans/lr-sweep.toml, runs in runs-lr/; docs/proxy-study.md). Each tier's SMELT twin
trains at its Baseline's lr.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import tomli_w

from scaling.accounting.costs import costs
from scaling.accounting.tiers import get_config
from scaling.design.sizing import scaled_baseline

BUDGETS = (3.56e11, 6.32e11, 1.12e12, 2e12, 3.56e12)  # FLOPs: quarter-decade steps over one decade
D_MODELS = (4, 6, 10, 14, 20, 28, 40, 56, 80)  # the size grid (Baseline d_model), ~1.7x in N per step
# (d_model 9 has no SMELT twin within 1% at width multiple 1, so the grid takes 10). d_model 4 was
# added after the first runs: the Baseline's lowest loss at the two smaller budgets was at d_model 6,
# the smallest size then (a minimum at the edge is not bracketed); it has seed 0 only
SEED1_SIZES = (6, 10, 14, 20, 28, 40, 56)
# index of the largest budget a size trains to (default: the last). Every size goes to the last:
# a first version stopped d_model 6 and 10 at the second budget, and the first finished runs put
# the third budget's lowest loss at d_model 14, the smallest size it then had (not bracketed)
LAST_BUDGET: dict[int, int] = {4: 2, 6: 2, 10: 3, 14: 3}  # the decade extension (budgets 2e12, 3.56e12)
# stops the smallest sizes early: at 1.12e12 the lowest losses sat at d_model 14-28, and a tiny
# model at 3.56e12 FLOPs reads 10M+ tokens at the CPU's worst FLOP rate
MIN_TOKENS = 150_000  # a point needs >= 73 updates: at 49 (0.1M tokens) every size of the lr
# sweep was still on the early plateau (loss 6.5-7.2 nats, near the unigram level)
LR_AT_6 = float(sys.argv[1]) if len(sys.argv) > 1 else 1.2e-2  # set from the lr sweep
LR_EXPONENT = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
TRAIN = {
    "batch_size": 8,  # 2048 tokens per update: twice the updates per token of plans/cpu-proxy.toml
    "val_windows": 200,  # 51,200 tokens, evenly spaced over the held-out split (the same in every run)
    "warmup": 10,
    "schedule": "wsd",
    "decay_fraction": 0.2,
    "weight_decay": 0.1,
    "eval_every": 100000,  # validation only at each budget end (the whole held-out split)
    "ckpt_every": 100,
    "device": "cpu",
}
EXECUTOR = {"kind": "local", "concurrency": 2, "threads_per_job": 1}
SEED1_BUDGETS = (0, 1)  # the second seed trains to budget 1 and branches at budget 0


def lr_of(d_model: int) -> float:
    return float(f"{LR_AT_6 * (d_model / 6) ** -LR_EXPONENT:.3g}")


def main() -> None:
    shape = get_config("proxy-xxs", "baseline")
    models, tiers, seed1 = {}, {}, {}
    for i, d in enumerate(D_MODELS):
        cfg = scaled_baseline(shape, d / shape.d_model, 1)
        assert cfg.d_model == d, (cfg.d_model, d)
        flops = costs(cfg).flops_per_token
        last = LAST_BUDGET.get(d, len(BUDGETS) - 1)
        uses = [j for j in range(last + 1) if BUDGETS[j] / flops >= MIN_TOKENS]
        name = f"iso-d{d:02d}"
        models[name] = {**{k: v for k, v in cfg.to_dict().items() if k not in ("name", "loop_start",
                                                                                   "loop_end", "n_loops")},
                        "width_multiple": 1, "proxy": True}
        tokens = [int(math.floor(BUDGETS[j] / flops)) for j in uses]
        tiers[name] = {"budgets": tokens, "lr": lr_of(d)}
        seed1_tokens = [int(math.floor(BUDGETS[j] / flops)) for j in SEED1_BUDGETS if j in uses]
        if seed1_tokens and d in SEED1_SIZES:
            seed1[name] = {"budgets": seed1_tokens, "lr": lr_of(d)}
        print(f"{name}: N={costs(cfg).active_params:,} F={flops:.4g} lr={lr_of(d):.3g} "
              f"budgets={[f'{BUDGETS[j]:.3g}' for j in uses]} tokens={tokens}")
    rule = f"lr = {LR_AT_6:g} * (d_model/6)^-{LR_EXPONENT:g}"
    common = {"train": {**TRAIN, "lr": LR_AT_6}, "executor": EXECUTOR}
    head = (
        "# Written by plans/make_isoflop_study.py (do not edit by hand; rerun the script).\n"
        f"# IsoFLOP proxy study: budgets {', '.join(f'{c:.3g}' for c in BUDGETS)} FLOPs, sizes d_model "
        f"{', '.join(map(str, D_MODELS))}\n# (proxy-xxs shape scaled), 6-8 sizes per budget and "
        f"architecture, one WSD trunk per size with a cooldown branch\n# at each budget it serves. "
        f"Per-size peak lr: {rule} (lr sweep, docs/proxy-study.md).\n")
    main_doc = {
        "sweep": {"name": "isoflop-study",
                  "description": f"IsoFLOP sets at C = {', '.join(f'{c:.3g}' for c in BUDGETS)} FLOPs; "
                                 f"{len(D_MODELS)} sizes, 6-8 per budget; seed 0; {rule}",
                  "tiers": list(models), "archs": ["baseline", "smelt"], "seeds": [0], "runs_dir": "runs"},
        **common, "tier": tiers, "model": models}
    seed_doc = {
        "sweep": {"name": "isoflop-study-seed1",
                  "description": "second seed at C = "
                                 f"{', '.join(f'{BUDGETS[j]:.3g}' for j in SEED1_BUDGETS)}: "
                                 "the seed-to-seed noise",
                  "tiers": list(seed1), "archs": ["baseline", "smelt"], "seeds": [1], "runs_dir": "runs"},
        **common, "tier": seed1, "model": {k: models[k] for k in seed1}}
    here = Path(__file__).resolve().parent
    (here / "isoflop-study.toml").write_text(head + tomli_w.dumps(main_doc))
    (here / "isoflop-study-seed1.toml").write_text(head + tomli_w.dumps(seed_doc))


if __name__ == "__main__":
    main()

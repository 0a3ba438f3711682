"""The training-curves table of a runs folder: every logged line of every run's metrics log,
with the run's architecture, tier, size and FLOPs per token (for the loss-curve figures and
notebooks; the fits read the budget points with ``scaling.fitting.tables``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.common.files import bad_number
from scaling.common.run_folder import METRICS, find_run_folders

CURVE_COLUMNS = ("run", "arch", "tier", "N", "flops_per_token", "complete", "iter", "step", "tokens",
                 "flops", "branch", "train_loss", "val_loss", "val_bpb", "lr", "budget_index", "seed")


def read_curves(runs_dir: str | Path, *, warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Training logs of every run under ``runs_dir`` (finished or not), one row per logged line.

    Columns (``CURVE_COLUMNS``): run, arch, tier, N (active non-embedding parameters, as the
    fits use), flops_per_token F (training FLOPs/token), complete (final.json says so), iter,
    step, tokens, flops = F * tokens, branch (<NA> on the WSD trunk, else the budget index of the
    cooldown branch), train_loss, val_loss, val_bpb (NaN where not evaluated), lr, budget_index
    (set on the validation that closes a token budget: the points the fits use). A torn last
    line of a log being written is skipped and said so through ``warn``
    (``scaling.common.files.read_jsonl``; a broken line before it is an error); seed (config.json's
    ``seed``, <NA> where absent) pairs runs for :func:`val_differences`. A run folder
    whose config.json cannot be read is skipped with a warning.
    """
    frames = []
    for run in find_run_folders(runs_dir, METRICS):
        try:
            cfg = run.config()
            acc = cfg["accounting"]
            meta = {"run": str(cfg.get("run", run.name)), "arch": str(cfg["arch"]),
                    "tier": str(cfg.get("tier", run.name)), "N": float(acc["active_params"]),
                    "flops_per_token": float(acc["flops_per_token"])}
            seed = cfg.get("seed")
            numeric = isinstance(seed, (int, float)) and not isinstance(seed, bool)
            meta["seed"] = int(seed) if numeric else None
        except UserError as exc:
            if warn is not None:
                warn(f"skipping run {run.path}: {exc}")
            continue
        except (ValueError, KeyError, TypeError) as exc:
            if warn is not None:
                warn(f"skipping run {run.path}: unreadable config.json ({exc})")
            continue
        read = run.metrics()
        if read.skipped and warn is not None:
            warn(f"run {run.path}: {read.skipped} torn last line of {METRICS} left out (a log being written)")
        rows = read.rows
        bad = next((i for i, r in enumerate(rows, start=1) if bad_number(r)), None)
        if bad is not None:
            if warn is not None:
                warn(f"skipping run {run.path}: record {bad} of {METRICS} holds {bad_number(rows[bad - 1])} "
                     "that is not a number")
            continue
        if not rows:
            continue
        df = pd.DataFrame(rows)
        for col in CURVE_COLUMNS:
            if col not in df.columns:
                df[col] = np.nan
        for k, v in meta.items():
            df[k] = v
        df["complete"] = run.complete()
        df["flops"] = df["tokens"].astype(float) * meta["flops_per_token"]
        frames.append(df[list(CURVE_COLUMNS)])
    if not frames:
        raise UserError(f"no training logs ({METRICS}) under {runs_dir}")
    out = pd.concat(frames, ignore_index=True)
    out["branch"] = pd.array(out["branch"].to_numpy(dtype=float), dtype="Int64")
    out["budget_index"] = pd.array(out["budget_index"].to_numpy(dtype=float), dtype="Int64")
    out["seed"] = pd.array([None if s is None or s != s else int(s) for s in out["seed"]], dtype="Int64")
    for col in ("tokens", "flops", "train_loss", "val_loss", "val_bpb", "lr", "step", "iter"):
        out[col] = out[col].astype(float)
    return out


DIFF_COLUMNS = ("tier", "seed", "budget_index", "tokens", "reference_run", "candidate_run", "reference_loss",
                "candidate_loss", "diff")


def val_differences(curves: pd.DataFrame, reference: str = "baseline", candidate: str = "smelt",
                    tokens_rtol: float = 0.01) -> pd.DataFrame:
    """Validation loss of ``candidate`` minus ``reference`` at matched (tier, seed, tokens), from a
    :func:`read_curves` table: d = L_candidate - L_reference (nats/token; negative = candidate better).

    Two kinds of matched points: the validation closing each token budget, paired on
    (tier, seed, budget_index) when the two token counts agree within ``tokens_rtol`` (the rule of
    ``scaling.fitting.compare``, which pairs the same points; budget_index set), and validations
    on the WSD trunk at the same token count (budget_index <NA>). ``tokens`` is the reference's.
    A seed missing from config.json (<NA>) pairs with <NA>. Columns: ``DIFF_COLUMNS``.
    """
    ev = curves[curves["val_loss"].notna()]
    ref, cand = ev[ev["arch"] == reference], ev[ev["arch"] == candidate]
    rows = []
    key = ["tier", "seed"]
    for (tier, seed), r in ref.groupby(key, dropna=False):
        same = cand["seed"].isna() if pd.isna(seed) else (cand["seed"] == seed).fillna(False)
        c = cand[(cand["tier"] == tier) & same]
        if c.empty:
            continue
        for ends in (True, False):
            rr = r[r["budget_index"].notna() == ends]
            cc = c[c["budget_index"].notna() == ends]
            on = ["run", "budget_index"] if ends else ["run", "tokens"]
            rr = rr.drop_duplicates(on, keep="last")
            cc = cc.drop_duplicates(on, keep="last")
            for _, a in rr.iterrows():
                if ends:
                    b = cc[cc["budget_index"] == a["budget_index"]]
                    b = b[np.isclose(b["tokens"], a["tokens"], rtol=tokens_rtol, atol=0)]
                else:
                    b = cc[cc["tokens"] == a["tokens"]]
                for _, m in b.iterrows():
                    rows.append((tier, seed, a["budget_index"] if ends else pd.NA, float(a["tokens"]),
                                 a["run"], m["run"], float(a["val_loss"]), float(m["val_loss"]),
                                 float(m["val_loss"]) - float(a["val_loss"])))
    out = pd.DataFrame(rows, columns=list(DIFF_COLUMNS))
    out["seed"] = pd.array(out["seed"].tolist(), dtype="Int64")
    out["budget_index"] = pd.array(out["budget_index"].tolist(), dtype="Int64")
    return out.sort_values(["tier", "seed", "tokens"], na_position="first", ignore_index=True)


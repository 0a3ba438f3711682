"""The training-curves table of a runs folder: every logged line of every run's metrics log,
with the run's architecture, tier, size and FLOPs per token (for the loss-curve figures and
notebooks; the fits read the budget points with ``scaling.fitting.tables``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.common.run_folder import METRICS, find_run_folders

CURVE_COLUMNS = ("run", "arch", "tier", "N", "flops_per_token", "complete", "iter", "step", "tokens",
                 "flops", "branch", "train_loss", "val_loss", "val_bpb", "lr", "budget_index")


def read_curves(runs_dir: str | Path, *, warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Training logs of every run under ``runs_dir`` (finished or not), one row per logged line.

    Columns (``CURVE_COLUMNS``): run, arch, tier, N (active non-embedding parameters, as the
    fits use), flops_per_token F (training FLOPs/token), complete (final.json says so), iter,
    step, tokens, flops = F * tokens, branch (<NA> on the WSD trunk, else the budget index of the
    cooldown branch), train_loss, val_loss, val_bpb (NaN where not evaluated), lr, budget_index
    (set on the validation that closes a token budget: the points the fits use). A torn last
    line of a log being written is skipped and said so through ``warn``
    (``scaling.common.files.read_jsonl``; a broken line before it is an error); a run folder
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
    for col in ("tokens", "flops", "train_loss", "val_loss", "val_bpb", "lr", "step", "iter"):
        out[col] = out[col].astype(float)
    return out


"""Paper figures: one function per figure, each returns a ``matplotlib.figure.Figure``.

The functions take what the library computes (canonical points from ``scaling.fitting.tables``, fits
from ``scaling.fitting.fit``, a ``scaling.fitting.savings.SavingsResult``, analysis results from
``scaling.analysis.mechanisms``) and draw it; they compute nothing new beyond what a figure needs
(interpolating training curves onto IsoFLOP slices, evaluating a fitted law on a grid).
Figures are built on ``Figure`` objects, not pyplot, so a loop of them leaks no state; save one
with :func:`save`. ``smelt-scale plot`` and the notebooks both call these.

Conventions, for print: every axis labelled with its unit; log scales where a quantity spans
decades (tokens, FLOPs, parameters); Baseline always Okabe & Ito blue and SMELT vermillion
(colour-blind safe, the same as ``scaling.analysis.mechanisms.PALETTE``), other groups the rest of
seaborn's "colorblind" palette; sizes within an architecture as light-to-dark shades of its
colour plus distinct markers, so they stay apart in greyscale.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from scaling.common.errors import UserError
from scaling.fitting.tables import law_inputs, total_flops
from scaling.training import runlog

ARCH_COLOURS = {"baseline": "#0072B2", "smelt": "#D55E00"}
ARCH_LABELS = {"baseline": "Baseline", "smelt": "SMELT"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LEVEL_MARKERS = ("o", "s", "^", "v", "P", "X")   # IsoFLOP levels: D and * mark the minima there
_EXTRA = [c for c in sns.color_palette("colorblind").as_hex() if c.lower() not in ("#0173b2", "#d55e00")]
EXTRAPOLATION_SHADE = "#000000"

RC = {
    **sns.axes_style("ticks"),
    "font.size": 9, "axes.labelsize": 9, "axes.titlesize": 9.5, "legend.fontsize": 7.5,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "lines.linewidth": 1.5, "lines.markersize": 5,
    "axes.grid": True, "grid.alpha": 0.35, "grid.linewidth": 0.5, "axes.spines.top": False,
    "axes.spines.right": False, "legend.frameon": False, "figure.dpi": 120, "savefig.dpi": 200,
    "savefig.bbox": "tight", "image.cmap": "viridis",
}

PARAM_LABELS = {
    "E": r"$E$ (nats/token)", "A": r"$A$", "alpha": r"$\alpha$", "B": r"$B$", "beta": r"$\beta$",
    "a": r"$a=\beta/(\alpha+\beta)$  ($N^*\propto C^a$)",
    "b": r"$b=\alpha/(\alpha+\beta)$  ($D^*\propto C^b$)",
    "frontier_exponent": r"frontier exponent $\alpha\beta/(\alpha+\beta)$",
    "K": r"$K$", "c": r"$c$", "f_exponent": r"$F^*$ exponent $c/(a+c)$",
    "d_exponent": r"$D^*$ exponent $a/(a+c)$",
}


# -- plumbing --------------------------------------------------------------------------------
def _styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Draw inside the paper rc context (fonts and spines are read when artists are created)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with mpl.rc_context(RC):
            return fn(*args, **kwargs)

    return wrapper


def _figure(nrows: int, ncols: int, width: float, height: float, **kw: Any):
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def save(fig: Figure, path: str | Path, dpi: int | None = None) -> Path:
    """Write a figure (format from the suffix: .png, .pdf, .svg); one-line error on failure."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise UserError(f"figure file must end in .png, .pdf or .svg, got {path.name}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with mpl.rc_context(RC):
            fig.savefig(path, dpi=dpi)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot write the figure {path}: {exc}") from None
    return path


def group_colours(groups: Iterable[str]) -> dict[str, str]:
    """Baseline blue, SMELT vermillion, any other group the next colour-blind-safe colour."""
    out, extra = {}, iter(_EXTRA * 3)
    for g in groups:
        out[g] = ARCH_COLOURS.get(g) or next(extra)
    return out


def group_label(g: str) -> str:
    return ARCH_LABELS.get(g, g)


def _order(groups: Iterable[str]) -> list[str]:
    rank = {"baseline": 0, "smelt": 1}
    return sorted(set(groups), key=lambda g: (rank.get(g, 2), str(g)))


def shades(colour: str, n: int) -> list[tuple[float, float, float]]:
    """n shades of one colour, light (smallest) to dark (largest); the lightest still prints."""
    base = np.array(mpl.colors.to_rgb(colour))
    light, dark = base + 0.55 * (1 - base), 0.55 * base
    if n == 1:
        return [tuple(base)]
    return [tuple(c) for c in sns.blend_palette([light, base, dark], n)]


def si(x: float, unit: str = "") -> str:
    """Compact engineering format: 273k, 1.2M, 3.4e12."""
    if not np.isfinite(x):
        return "-"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale and abs(x) < 1e12:
            return f"{x / scale:.3g}{suffix}{unit}"
    if abs(x) >= 1e12:
        return f"{x:.2g}{unit}"
    return f"{x:.3g}{unit}"


def _log(ax, axis: str = "x") -> None:
    """Log scale; on an axis spanning under 1.5 decades, minor ticks labelled at 2 and 5 only
    (matplotlib labels every minor tick there, which crowds a print figure)."""
    getattr(ax, f"set_{axis}scale")("log")
    which = getattr(ax, f"{axis}axis")

    def minor(x: float, _pos: Any = None) -> str:
        lo, hi = sorted(which.get_view_interval())
        if x <= 0 or lo <= 0 or math.log10(hi / lo) > 1.5:
            return ""
        e = math.floor(math.log10(x) + 1e-9)
        m = round(x / 10 ** e, 6)
        return f"${m:g}\\times10^{{{e}}}$" if m in (2.0, 5.0) else ""

    which.set_minor_formatter(mpl.ticker.FuncFormatter(minor))


def _legend(ax, **kw: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(**kw)


def _fig_legend(fig: Figure, axes: Sequence[Any], ncol: int = 4) -> None:
    """One legend below the panels with every distinct label of ``axes`` (keeps the data clear)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if not lab.startswith("_") and lab not in seen:
                seen[lab] = h
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=min(ncol, len(seen)),
                   fontsize=7)


def _shade_extrapolation(ax, data_range: tuple[float | None, float | None],
                         x_range: tuple[float, float]) -> None:
    """Shade compute outside the fitted data (both sides), dotted lines at its ends, and label
    the side beyond the largest fitted compute as extrapolation."""
    lo, hi = data_range
    x0, x1 = x_range
    if lo is not None and np.isfinite(lo) and lo > x0:
        ax.axvline(lo, color="0.25", lw=0.9, ls=":")
        ax.axvspan(x0, lo, color=EXTRAPOLATION_SHADE, alpha=0.06, lw=0)
    if hi is None or not np.isfinite(hi) or hi >= x1:
        return
    ax.axvline(hi, color="0.25", lw=0.9, ls=":")
    ax.axvspan(hi, x1, color=EXTRAPOLATION_SHADE, alpha=0.06, lw=0)
    ax.text(hi * 1.3, 0.97, "extrapolation →", transform=ax.get_xaxis_transform(), va="top",
            ha="left", fontsize=7.5, color="0.25")
    ax.text(hi / 1.3, 0.97, "data", transform=ax.get_xaxis_transform(), va="top", ha="right",
            fontsize=7.5, color="0.25")


# -- training curves -------------------------------------------------------------------------
CURVE_COLUMNS = ("run", "arch", "tier", "N", "flops_per_token", "complete", "iter", "step", "tokens",
                 "flops", "branch", "train_loss", "val_loss", "val_bpb", "lr", "budget_index")


def read_curves(runs_dir: str | Path, *, warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Training logs of every run under ``runs_dir`` (finished or not), one row per logged line.

    Columns (``CURVE_COLUMNS``): run, arch, tier, N (active non-embedding parameters, as the
    fits use), flops_per_token F (training FLOPs/token), complete (final.json says so), iter,
    step, tokens, flops = F * tokens, branch (<NA> on the WSD trunk, else the budget index of the
    cooldown branch), train_loss, val_loss, val_bpb (NaN where not evaluated), lr, budget_index
    (set on the validation that closes a token budget: the points the fits use). A torn last
    line of a log being written is skipped (``scaling.training.runlog.read_jsonl``); a run folder whose
    config.json cannot be read is skipped with a warning.
    """
    root = Path(runs_dir)
    if not root.is_dir():
        raise UserError(f"no such runs folder: {root}")
    frames = []
    for metrics in sorted(root.rglob(runlog.METRICS)):
        folder = metrics.parent
        try:
            cfg = runlog.read_json(folder / runlog.CONFIG)
            acc = cfg["accounting"]
            meta = {"run": str(cfg.get("run", folder.name)), "arch": str(cfg["arch"]),
                    "tier": str(cfg.get("tier", folder.name)), "N": float(acc["active_params"]),
                    "flops_per_token": float(acc["flops_per_token"])}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if warn is not None:
                warn(f"skipping run {folder}: unreadable config.json ({exc})")
            continue
        rows = runlog.read_jsonl(metrics)
        if not rows:
            continue
        complete = False
        if (folder / runlog.FINAL).exists():
            try:
                complete = bool(runlog.read_json(folder / runlog.FINAL).get("complete", False))
            except (OSError, ValueError, AttributeError):
                complete = False
        df = pd.DataFrame(rows)
        for col in CURVE_COLUMNS:
            if col not in df.columns:
                df[col] = np.nan
        for k, v in meta.items():
            df[k] = v
        df["complete"] = complete
        df["flops"] = df["tokens"].astype(float) * meta["flops_per_token"]
        frames.append(df[list(CURVE_COLUMNS)])
    if not frames:
        raise UserError(f"no training logs ({runlog.METRICS}) under {root}")
    out = pd.concat(frames, ignore_index=True)
    out["branch"] = pd.array(out["branch"].to_numpy(dtype=float), dtype="Int64")
    out["budget_index"] = pd.array(out["budget_index"].to_numpy(dtype=float), dtype="Int64")
    for col in ("tokens", "flops", "train_loss", "val_loss", "val_bpb", "lr", "step", "iter"):
        out[col] = out[col].astype(float)
    return out


def _tier_order(df: pd.DataFrame) -> list[str]:
    return list(df.groupby("tier")["N"].max().sort_values().index)


@_styled
def loss_curves(curves: pd.DataFrame, *, x: str = "tokens", smooth: int = 5) -> Figure:
    """Training and validation loss per tier (one panel each), Baseline and SMELT overlaid.

    Lines: training loss (running mean over ``smooth`` logged steps) on the WSD trunk (light) and
    on each cooldown branch (full colour). Hollow markers: validation on the trunk; filled
    markers: validation at the end of each token budget (the points the scaling fits use).
    ``x`` is "tokens" (training tokens) or "flops" (training FLOPs = F * tokens).
    """
    if x not in ("tokens", "flops"):
        raise UserError(f"x must be tokens or flops, got {x!r}")
    tiers = _tier_order(curves)
    groups = _order(curves["arch"])
    colours = group_colours(groups)
    ncol = min(4, len(tiers))
    nrow = math.ceil(len(tiers) / ncol)
    fig, axes = _figure(nrow, ncol, 2.6 * ncol + 0.6, 2.6 * nrow + 0.4, sharex=True, sharey=True)
    for ax in axes.flat[len(tiers):]:
        ax.set_visible(False)
    for ax, tier in zip(axes.flat, tiers):
        sub = curves[curves["tier"] == tier]
        title = []
        for g in groups:
            arch = sub[sub["arch"] == g]
            if arch.empty:
                continue
            c = colours[g]
            names = sorted(arch["run"].unique())
            running = sum(not arch.loc[arch["run"] == r, "complete"].iloc[0] for r in names)
            title.append(f"{group_label(g)} N={si(arch['N'].iloc[0])}"
                         + (f", {len(names)} seeds" if len(names) > 1 else "")
                         + (f" ({running} running)" if running and len(names) > 1 else
                            " (running)" if running else ""))
            for name in names:
                run = arch[arch["run"] == name]
                trunk = run[run["branch"].isna()].sort_values("step")
                tr = trunk["train_loss"].rolling(smooth, min_periods=1).mean()
                ax.plot(trunk[x], tr, color=c, alpha=0.35, lw=1.0)
                for _, br in run[run["branch"].notna()].groupby("branch"):
                    br = br.sort_values("step")
                    ax.plot(br[x], br["train_loss"].rolling(smooth, min_periods=1).mean(), color=c, lw=1.0,
                            alpha=0.9)
                ev = run[run["val_loss"].notna()]
                mid = ev[ev["budget_index"].isna()]
                end = ev[ev["budget_index"].notna()]
                ax.plot(mid[x], mid["val_loss"], ls="none", marker="o", mfc="white", mec=c, ms=4)
                ax.plot(end[x], end["val_loss"], ls="none", marker=MARKERS[groups.index(g) % len(MARKERS)],
                        color=c, ms=5.5)
        _log(ax, "x")
        ax.set_title(f"{tier}\n" + "\n".join(title), fontsize=8)
        ax.set_xlabel("training tokens" if x == "tokens" else "training compute C (FLOPs)")
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (nats/token)")
    # one legend explaining the encodings
    ax0 = axes.flat[0]
    handles = [mpl.lines.Line2D([], [], color=colours[g], marker=MARKERS[i % len(MARKERS)], ls="none",
                                label=f"{group_label(g)}: validation at a budget's end")
               for i, g in enumerate(groups)]
    handles += [mpl.lines.Line2D([], [], color="0.4", marker="o", mfc="white", ls="none",
                                 label="validation on the trunk"),
                mpl.lines.Line2D([], [], color="0.4", alpha=0.35, label="train loss, WSD trunk"),
                mpl.lines.Line2D([], [], color="0.4", label="train loss, cooldown branch")]
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=7)
    lo = curves["val_loss"].min()
    hi = curves["train_loss"].quantile(0.995) if curves["train_loss"].notna().any() else None
    if np.isfinite(lo) and hi is not None and np.isfinite(hi):
        ax0.set_ylim(lo - 0.2, hi + 0.1)
    return fig


# -- fitted laws -----------------------------------------------------------------------------
def _inputs(fit: Any, df: pd.DataFrame) -> dict[str, np.ndarray]:
    return law_inputs(df, fit.law_obj.inputs, source=f"group {fit.group!r}")


def _levels(values: np.ndarray, rel: float = 0.02) -> np.ndarray:
    """Distinct levels of a quantity, merging values within ``rel`` of each other."""
    v = np.sort(np.unique(values))
    out = [v[0]]
    for x in v[1:]:
        if x > out[-1] * (1 + rel):
            out.append(x)
    return np.array(out)


def _nearest(values: np.ndarray, levels: np.ndarray) -> np.ndarray:
    return np.abs(np.log(values)[:, None] - np.log(levels)[None, :]).argmin(axis=1)


def _param_text(fit: Any) -> str:
    p = fit.params
    if fit.law_obj.inputs == ("N", "D"):
        head = (f"$L = {p['E']:.3g} + {p['A']:.3g}/N^{{{p['alpha']:.3f}}} + "
                f"{p['B']:.3g}/D^{{{p['beta']:.3f}}}$")
    else:
        head = fit.law_obj.formula + ": " + ", ".join(f"{k}={v:.3g}" for k, v in p.items())
    d = fit.diagnostics
    return (f"{head}\n{fit.n_points} points, RMSE(log L) {d['rmse_log']:.3f}"
            + ("" if d.get("identified", True) else ", not identified"))


@_styled
def fits(points: pd.DataFrame, fits: Mapping[str, Any], *, groups: Sequence[str] | None = None) -> Figure:
    """Data and fitted law per group (one row each): loss vs tokens D at each size N (left) and
    loss vs N at each D (right). Markers: the fitted points; lines: the law through them.

    Chinchilla-form fits draw the law continuously in both N and D; a law in other inputs
    (the smelt form's F, S) draws it in D and through the observed sizes in N.
    """
    groups = _order(groups or [g for g in fits if (points["group"] == g).any()])
    if not groups:
        raise UserError("no group has both points and a fit")
    colours = group_colours(groups)
    fig, axes = _figure(len(groups), 2, 8.2, 3.0 * len(groups) + 0.3)
    for row, g in enumerate(groups):
        fit, sub = fits[g], points[points["group"] == g].reset_index(drop=True)
        Ns = _levels(sub["N"].to_numpy())
        Ds = _levels(sub["D"].to_numpy())
        ni, di = _nearest(sub["N"].to_numpy(), Ns), _nearest(sub["D"].to_numpy(), Ds)
        cN, cD = shades(colours[g], len(Ns)), shades(colours[g], len(Ds))
        ax = axes[row, 0]
        dgrid = np.geomspace(Ds[0] / 1.6, Ds[-1] * 1.6, 80)
        for i, N in enumerate(Ns):
            m = ni == i
            one = sub[m].iloc[[0]]
            X = {k: np.full_like(dgrid, v[0]) for k, v in _inputs(fit, one).items()}
            X["D"] = dgrid
            ax.plot(dgrid, fit.predict(**X), color=cN[i], lw=1.2)
            ax.plot(sub.loc[m, "D"], sub.loc[m, "loss"], ls="none", marker=MARKERS[i % len(MARKERS)],
                    color=cN[i], mec="0.15", mew=0.4, label=f"N = {si(N)}")
        _log(ax, "x")
        ax.set_xlabel("training tokens D")
        ax.set_ylabel(f"{group_label(g)}\nvalidation loss (nats/token)")
        _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="active params", title_fontsize=7)
        ax.text(0.02, 0.03, _param_text(fit), transform=ax.transAxes, fontsize=7, va="bottom")
        ax = axes[row, 1]
        ngrid = np.geomspace(Ns[0] / 1.6, Ns[-1] * 1.6, 80)
        for j, D in enumerate(Ds):
            m = di == j
            if fit.law_obj.inputs == ("N", "D"):
                ax.plot(ngrid, fit.predict(N=ngrid, D=np.full_like(ngrid, D)), color=cD[j], lw=1.2)
            else:
                at = sub[m].sort_values("N")
                ax.plot(at["N"], fit.predict(**_inputs(fit, at)), color=cD[j], lw=1.2)
            ax.plot(sub.loc[m, "N"], sub.loc[m, "loss"], ls="none", marker=MARKERS[j % len(MARKERS)],
                    color=cD[j], mec="0.15", mew=0.4, label=f"D = {si(D)}")
        _log(ax, "x")
        ax.set_xlabel("active non-embedding parameters N")
        ax.set_ylabel("validation loss (nats/token)")
        _legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="tokens", title_fontsize=7)
    fig.suptitle("Scaling-law fits (approach 3, Huber on log loss): data and fitted law", fontsize=10)
    return fig


@_styled
def residuals(points: pd.DataFrame, fits: Mapping[str, Any], *,
              groups: Sequence[str] | None = None) -> Figure:
    """Log residuals log L - log L_hat of every fitted point against D, one panel per group,
    shades and markers by size N; the band is +-RMSE. A log residual of 0.01 is a 1% error."""
    groups = _order(groups or [g for g in fits if (points["group"] == g).any()])
    colours = group_colours(groups)
    fig, axes = _figure(1, len(groups), 3.6 * len(groups) + 0.3, 3.0, sharey=True)
    for ax, g in zip(axes[0], groups):
        fit, sub = fits[g], points[points["group"] == g].reset_index(drop=True)
        r = np.log(sub["loss"].to_numpy()) - np.log(fit.predict(**_inputs(fit, sub)))
        Ns = _levels(sub["N"].to_numpy())
        ni = _nearest(sub["N"].to_numpy(), Ns)
        cN = shades(colours[g], len(Ns))
        rmse = float(np.sqrt(np.mean(r ** 2)))
        ax.axhspan(-rmse, rmse, color=colours[g], alpha=0.1, lw=0)
        ax.axhline(0, color="0.2", lw=0.8)
        for i, N in enumerate(Ns):
            for j, run in enumerate(sorted(sub.loc[ni == i, "run"].unique())):
                m = (ni == i) & (sub["run"] == run).to_numpy()
                o = np.argsort(sub.loc[m, "D"].to_numpy())
                ax.plot(sub.loc[m, "D"].to_numpy()[o], r[m][o], ls="-", lw=0.6,
                        marker=MARKERS[i % len(MARKERS)], color=cN[i], mec="0.15", mew=0.4,
                        label=f"N = {si(N)}" if j == 0 else None)
        _log(ax, "x")
        ax.set_xlabel("training tokens D")
        ax.set_title(f"{group_label(g)}: RMSE {rmse:.4f}, max |r| {np.abs(r).max():.4f}")
        _legend(ax, fontsize=6.5, loc="best")
    axes[0, 0].set_ylabel(r"log residual $\log L - \log \hat L$  (≈ relative error)")
    return fig


@_styled
def params(fits: Mapping[str, Any], *, names: Sequence[str] | None = None) -> Figure:
    """Fitted parameters and derived exponents per group: estimate (large marker), bootstrap
    percentile interval (bar) and the bootstrap resamples (dots). Scale factors on log axes."""
    groups = _order(fits)
    colours = group_colours(groups)
    first = fits[groups[0]]
    law = first.law_obj
    names = list(names or [*law.params, *law.derive(first.params)])   # the law's exponents, not G, H
    ncol = 4
    nrow = math.ceil(len(names) / ncol)
    fig, axes = _figure(nrow, ncol, 8.4, 2.3 * nrow + 0.4)
    rng = np.random.default_rng(0)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes.flat, names):
        for i, g in enumerate(groups):
            f = fits[g]
            if name in f.params:
                value = f.params[name]
                j = list(law.params).index(name)
                samples = f.bootstrap[:, j] if f.bootstrap.shape[0] else np.zeros(0)
            else:
                value = f.derived[name]
                samples = np.array([law.derive(s)[name] for s in f.bootstrap])
            samples = samples[np.isfinite(samples)]
            if samples.size:
                ax.plot(i + 0.16 + 0.08 * rng.uniform(-1, 1, samples.size), samples, ls="none", marker=".",
                        ms=2.5, color=colours[g], alpha=0.35)
            lo, hi = f.ci.get(name, (math.nan, math.nan))
            if np.isfinite(lo) and np.isfinite(hi):
                ax.errorbar([i], [value], yerr=[[max(value - lo, 0)], [max(hi - value, 0)]], fmt="none",
                            ecolor=colours[g], capsize=4, lw=1.4)
            ax.plot([i], [value], marker=MARKERS[i % len(MARKERS)], color=colours[g], ms=7, mec="0.15",
                    mew=0.5, ls="none")
        if name in law.log_params and name != "E":
            _log(ax, "y")
        else:
            ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.set_xticks(range(len(groups)), [group_label(g) for g in groups])
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_title(PARAM_LABELS.get(name, name), fontsize=8.5)
        ax.grid(axis="x", visible=False)
    K = first.bootstrap.shape[0]
    level = 100 * first.settings.get("ci_level", 0.95)
    fig.suptitle(f"Fitted parameters: estimate, {level:.0f}% bootstrap interval over runs "
                 f"({K} resamples) and the resamples", fontsize=10)
    return fig


# -- IsoFLOP slices --------------------------------------------------------------------------
def isoflop_slices(points: pd.DataFrame, levels: Sequence[float] | None = None, *, n_levels: int = 4,
                   min_sizes: int = 4) -> pd.DataFrame:
    """Loss of every run at fixed training compute, interpolated along its budget points.

    Each run's points (recorded FLOPs C, loss) are interpolated linearly in (log C, log L)
    inside the run's own compute range (no extrapolation): a WSD sweep with the same token
    budgets for every size has no two sizes at the same compute, and this is how Hoffmann
    et al. (2022, approach 2) read IsoFLOP profiles off training curves. Default ``levels``:
    ``n_levels`` log-spaced computes inside the range every group covers with at least
    ``min_sizes`` distinct sizes (fewer where no range has that many). Returns columns group, run,
    N, compute, loss, D (= compute / the run's recorded FLOPs per token).
    """
    df = points.copy()
    df["C"] = total_flops(df)
    curves = {r: g.sort_values("C") for r, g in df.groupby("run") if g["C"].nunique() >= 2}
    if not curves:
        raise UserError("IsoFLOP slices need runs with at least two budgets each")
    if levels is None:
        lo_hi = []
        for _, gp in df.groupby("group"):
            runs = [(float(c["N"].iloc[0]), np.log(c["C"].min()), np.log(c["C"].max()))
                    for r, c in curves.items() if r in set(gp["run"])]
            if not runs:
                continue
            spans = np.array([(lo, hi) for _, lo, hi in runs])
            sizes = np.array([n for n, _, _ in runs])
            grid = np.linspace(spans[:, 0].min(), spans[:, 1].max(), 400)
            inside = (grid[:, None] >= spans[None, :, 0]) & (grid[:, None] <= spans[None, :, 1])
            # coverage counts sizes, not runs: two seeds of one size are one point of a profile
            cover = np.array([np.unique(sizes[row]).size for row in inside])
            need = min(min_sizes, int(cover.max()))
            ok = grid[cover >= need]
            lo_hi.append((ok.min(), ok.max()))
        lo = max(a for a, _ in lo_hi)
        hi = min(b for _, b in lo_hi)
        if hi <= lo:
            raise UserError("the groups share no compute range covered by enough runs")
        pad = 0.04 * (hi - lo)
        levels = np.exp(np.linspace(lo + pad, hi - pad, n_levels))
    rows = []
    for run, c in curves.items():
        x, y = np.log(c["C"].to_numpy()), np.log(c["loss"].to_numpy())
        F = float(c["C"].iloc[-1] / c["D"].iloc[-1])
        for C in levels:
            if x.min() <= np.log(C) <= x.max():
                rows.append({"group": c["group"].iloc[0], "run": run, "N": float(c["N"].iloc[0]),
                             "compute": float(C), "loss": float(np.exp(np.interp(np.log(C), x, y))),
                             "D": float(C) / F})
    return pd.DataFrame(rows, columns=["group", "run", "N", "compute", "loss", "D"])


def flops_per_token_of_size(N: np.ndarray, sizes: np.ndarray, flops_per_token: np.ndarray) -> np.ndarray:
    """F(N): the runs' FLOPs per token as a smooth function of size, a polynomial of degree
    min(2, sizes - 1) in (log N, log F). Smooth so that the law's IsoFLOP minimum moves
    continuously with C (a piecewise interpolation puts kinks, and minima, at the trained sizes)."""
    sizes, flops_per_token = np.asarray(sizes, dtype=float), np.asarray(flops_per_token, dtype=float)
    if sizes.size == 1:
        return np.full_like(np.asarray(N, dtype=float), flops_per_token[0])
    q = np.polyfit(np.log(sizes), np.log(flops_per_token), min(2, sizes.size - 1))
    return np.exp(np.polyval(q, np.log(N)))


@_styled
def isoflop(points: pd.DataFrame, fits: Mapping[str, Any] | None = None, *,
            levels: Sequence[float] | None = None, n_levels: int = 4) -> Figure:
    """IsoFLOP profiles (approach 2) per group, and the compute-optimal size N*(C) of both.

    Per group panel: loss at fixed compute against N (markers, from :func:`isoflop_slices`),
    the parabola in log N through them (dashed) with its vertex (diamond) where
    ``scaling.fitting.approaches.isoflop_optima`` accepts it (convex, inside the sampled sizes), and, for
    a chinchilla-form fit, the fitted law along the same compute (solid; D = C / F(N), F(N) the
    runs' FLOPs per token, :func:`flops_per_token_of_size`) with its minimum (star). Last panel: N*(C)
    from the law along real FLOPs (solid), the closed form with C = k N D that ``scaling.fitting.savings``
    uses (dashed, k = median FLOPs/(N D)), and the parabola vertices.
    """
    from scaling.fitting.approaches import isoflop_optima

    sl = isoflop_slices(points, levels, n_levels=n_levels)
    groups = _order(sl["group"])
    colours = group_colours(groups)
    levels_ = np.sort(sl["compute"].unique())
    fig, axes = _figure(1, len(groups) + 1, 3.1 * (len(groups) + 1) + 0.3, 3.2)
    nstar_ax = axes[0, -1]
    for ax, g in zip(axes[0], groups):
        s = sl[sl["group"] == g]
        gp = points[points["group"] == g]
        fit = None if fits is None else fits.get(g)
        cl = shades(colours[g], len(levels_))
        sizes = (pd.Series(total_flops(gp) / gp["D"].to_numpy(), index=gp["N"].to_numpy())
                 .groupby(level=0).median())
        Nn, Fn = sizes.index.to_numpy(dtype=float), sizes.to_numpy(dtype=float)
        ngrid = np.geomspace(Nn.min() / 2.5, Nn.max() * 2.5, 200)
        used, _ = isoflop_optima(s["N"].to_numpy(), s["compute"].to_numpy(), s["loss"].to_numpy(),
                                 width=1e-6, min_points=4)
        vert = {round(math.log10(u["compute"]), 6): u["N_opt"] for u in used}
        vtx = []
        for i, C in enumerate(levels_):
            at = s[np.isclose(s["compute"], C)].sort_values("N")
            if at.empty:
                continue
            ax.plot(at["N"], at["loss"], ls="none", marker=LEVEL_MARKERS[i % len(LEVEL_MARKERS)], color=cl[i],
                    mec="0.15", mew=0.4)
            if at["N"].nunique() >= 3:
                q = np.polyfit(np.log(at["N"]), np.log(at["loss"]), 2)
                u = np.linspace(np.log(at["N"].min()), np.log(at["N"].max()), 60)
                ax.plot(np.exp(u), np.exp(np.polyval(q, u)), ls="--", lw=0.9, color=cl[i])
            nv = vert.get(round(math.log10(C), 6))
            if nv is not None:
                q = np.polyfit(np.log(at["N"]), np.log(at["loss"]), 2)
                ax.plot([nv], [np.exp(np.polyval(q, np.log(nv)))], marker="D", color=cl[i], mec="k", ms=6,
                        ls="none")
                vtx.append((C, nv))
            if fit is not None and fit.law_obj.inputs == ("N", "D"):
                Lc = fit.predict(N=ngrid, D=C / flops_per_token_of_size(ngrid, Nn, Fn))
                ax.plot(ngrid, Lc, color=cl[i], lw=1.1)
                j = int(np.argmin(Lc))
                ax.plot([ngrid[j]], [Lc[j]], marker="*", color=cl[i], mec="k", ms=10, ls="none")
        _log(ax, "x")
        ax.set_xlabel("active non-embedding parameters N")
        ax.set_ylabel("validation loss (nats/token)")
        span = s["loss"].max() - s["loss"].min()
        # y range of the data, not of the law's steep wings
        ax.set_ylim(s["loss"].min() - 0.25 * span, s["loss"].max() + 0.25 * span)
        ax.set_title(f"{group_label(g)}: IsoFLOP profiles")
        # N*(C)
        c = colours[g]
        cmin, cmax = float(total_flops(gp).min()), float(total_flops(gp).max())
        cgrid = np.geomspace(cmin / 3, cmax * 3, 40)
        if fit is not None and fit.law_obj.inputs == ("N", "D"):
            wide = np.geomspace(Nn.min() / 100, Nn.max() * 100, 2000)
            Fw = flops_per_token_of_size(wide, Nn, Fn)
            nstar = [wide[int(np.argmin(fit.predict(N=wide, D=C / Fw)))] for C in cgrid]
            ax2 = nstar_ax
            ax2.plot(cgrid, nstar, color=c, label=f"{group_label(g)}: law along real FLOPs")
            ax2.plot(cgrid, fit.optimal(cgrid)["N"], color=c, ls="--", lw=1.0,
                     label=f"{group_label(g)}: closed form, C = {fit.k:.3g}·N·D")
        if vtx:
            nstar_ax.plot([v[0] for v in vtx], [v[1] for v in vtx], marker="D", color=c, mec="k", ls="none",
                          label=f"{group_label(g)}: parabola vertices")
    for N in np.unique(points["N"]):
        nstar_ax.axhline(N, color="0.7", lw=0.5, ls=":")
    _log(nstar_ax, "x")
    _log(nstar_ax, "y")
    nstar_ax.set_xlabel("training compute C (FLOPs)")
    nstar_ax.set_ylabel("compute-optimal N* (active params)")
    nstar_ax.set_title("N*(C); dotted: the trained sizes")
    _legend(nstar_ax, fontsize=6, loc="upper left")
    key = [mpl.lines.Line2D([], [], color="0.45", marker=LEVEL_MARKERS[i % len(LEVEL_MARKERS)], mec="0.15",
                            mew=0.4, ls="none", label=f"C = {C:.2g} FLOPs") for i, C in enumerate(levels_)]
    key += [mpl.lines.Line2D([], [], color="0.45", ls="--", lw=0.9, label="parabola in log N"),
            mpl.lines.Line2D([], [], color="0.45", marker="D", mec="k", ls="none", label="its vertex"),
            mpl.lines.Line2D([], [], color="0.45", lw=1.1, label="fitted law"),
            mpl.lines.Line2D([], [], color="0.45", marker="*", mec="k", ms=10, ls="none",
                             label="law's minimum")]
    fig.legend(handles=key, loc="outside lower center", ncol=len(key), fontsize=6.5,
               title="IsoFLOP panels (darker shade: more compute)", title_fontsize=6.5)
    return fig


# -- frontier and savings --------------------------------------------------------------------
def _band(samples: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    q = 100 * (1 - level) / 2
    return np.nanpercentile(samples, q, axis=0), np.nanpercentile(samples, 100 - q, axis=0)


@_styled
def frontier(fits: Mapping[str, Any], points: pd.DataFrame | None = None, *, c_max: float = 1e22,
             sparsity: float | None = None, level: float = 0.95) -> Figure:
    """Compute-optimal frontier of every group: L*(C) (left) and the optimal size and tokens
    (right), from ``scaling.fitting.savings.frontier`` (closed form, C = k N D for the chinchilla form,
    C = F D for the smelt form at ``sparsity``), with the bootstrap percentile band. Markers: the
    fitted points at their recorded FLOPs. Right of the dotted line (the largest fitted compute)
    everything is extrapolation."""
    from scaling.fitting.savings import FittedLaw
    from scaling.fitting.savings import frontier as law_frontier

    groups = _order(fits)
    colours = group_colours(groups)
    laws = {g: FittedLaw.from_fit(fits[g], name=g) for g in groups}
    cmin = min(l.compute_min or 1e18 for l in laws.values())
    cmax_data = max(l.compute_max or 0.0 for l in laws.values()) or None
    C = np.geomspace(cmin / 3, max(c_max, 3 * (cmax_data or cmin)), 300)
    fig, axes = _figure(1, 2, 8.4, 3.3)
    ax, ax2 = axes[0]
    for i, g in enumerate(groups):
        law, c = laws[g], colours[g]
        opt = law_frontier(law.law, law.theta, C, k=law.flops_per_param, S=sparsity)
        ax.plot(C, opt.loss, color=c, label=f"{group_label(g)}: L*(C)")
        if law.samples is not None:
            ob = law_frontier(law.law, law.samples[:, None, :], C[None, :], k=law.flops_per_param, S=sparsity)
            lo, hi = _band(ob.loss, level)
            ax.fill_between(C, lo, hi, color=c, alpha=0.18, lw=0)
            lo, hi = _band(ob.size, level)
            ax2.fill_between(C, lo, hi, color=c, alpha=0.12, lw=0)
        ax2.plot(C, opt.size, color=c, label=f"{group_label(g)}: {'N*' if opt.size_name == 'N' else 'F*'}")
        ax2.plot(C, opt.tokens, color=c, ls="--", label=f"{group_label(g)}: D*")
        ax.axhline(law.params["E"], color=c, lw=0.7, ls=(0, (1, 2)))
        if points is not None:
            p = points[points["group"] == g]
            ax.plot(total_flops(p, law.flops_per_param), p["loss"], ls="none", marker=MARKERS[i], ms=3.5,
                    mfc="none", mec=c, alpha=0.8, label=f"{group_label(g)}: fitted points")
    for a in (ax, ax2):
        _log(a, "x")
        a.set_xlabel("training compute C (FLOPs)")
        _shade_extrapolation(a, (cmin, cmax_data), (C[0], C[-1]))
        a.set_xlim(C[0], C[-1])
    _log(ax2, "y")
    ax.set_ylabel("compute-optimal loss L* (nats/token)")
    ax.set_title("Frontier L*(C); dotted horizontals: fitted E")
    size = "N* (params)" if opt.size_name == "N" else "F* (FLOPs/token)"
    ax2.set_ylabel(f"optimal {size} and D* (tokens)")
    ax2.set_title("Optimal allocation")
    _fig_legend(fig, [ax, ax2], ncol=4)
    return fig


def savings_over(reference: Any, candidate: Any, budgets: Iterable[float], **kwargs: Any):
    """``scaling.fitting.savings.savings`` over many budgets, leaving out those it cannot answer.

    Returns (SavingsResult of the answered budgets, [(budget, reason) left out]). A budget is
    left out when its matching compute lies outside the bisection bracket (the reference never
    reaches the candidate's loss within 6 decades, or already beats it there), which can happen
    far from the data when two fitted frontiers cross. Keyword arguments go to ``savings``.
    """
    from scaling.fitting.savings import savings

    budgets = [float(b) for b in budgets]
    try:
        return savings(reference, candidate, budgets, **kwargs), []
    except UserError:
        pass
    keep, skipped = [], []
    for b in budgets:
        try:
            savings(reference, candidate, [b], **kwargs)
            keep.append(b)
        except UserError as exc:
            skipped.append((b, str(exc)))
    if not keep:
        raise UserError("no budget gives a savings value: " + (skipped[0][1] if skipped else "no budgets"))
    return savings(reference, candidate, keep, **kwargs), skipped


@_styled
def savings(result: Any, *, data_range: tuple[float, float] | None = None,
            reference: Any | None = None, mark: float | None = 1e21) -> Figure:
    """Compute savings of the candidate over the reference against the budget (left, %, with the
    bootstrap interval) and the loss gap at equal compute (right, nats/token).

    ``data_range``: (min, max) total FLOPs of the fitted runs; the data range is shaded and
    everything right of its end is marked as extrapolation. ``reference``: another
    SavingsResult (e.g. the paper's laws, ``--law-set paper``) drawn in grey, one line per
    sparsity. ``mark``: annotate the value at this budget when it is one of the rows.
    """
    c_cand = ARCH_COLOURS.get(result.candidate, _EXTRA[0])
    fig, axes = _figure(1, 2, 8.4, 3.2)
    ax, ax2 = axes[0]
    sparsities = sorted({r.sparsity for r in result.rows}, key=lambda s: -1 if s is None else s)
    styles = ["-", "--", ":", "-."]
    for k, S in enumerate(sparsities):
        rs = sorted([r for r in result.rows if r.sparsity == S], key=lambda r: r.budget)
        b = np.array([r.budget for r in rs])
        s = 100 * np.array([r.savings for r in rs])
        gap = np.array([r.loss_gap for r in rs])
        lab = f"{group_label(result.candidate)} vs {group_label(result.reference)}" + (
            "" if S is None else f", S = {S:g}")
        ax.plot(b, s, color=c_cand, marker="o", ms=3, ls=styles[k % 4], label=lab)
        ax2.plot(b, gap, color=c_cand, marker="o", ms=3, ls=styles[k % 4], label=lab)
        if all(r.savings_ci is not None for r in rs):
            ax.fill_between(b, [100 * r.savings_ci[0] for r in rs], [100 * r.savings_ci[1] for r in rs],
                            color=c_cand, alpha=0.18, lw=0,
                            label=f"{100 * result.ci_level:.0f}% bootstrap interval")
        if all(r.loss_gap_ci is not None for r in rs):
            ax2.fill_between(b, [r.loss_gap_ci[0] for r in rs], [r.loss_gap_ci[1] for r in rs], color=c_cand,
                             alpha=0.18, lw=0)
        if mark is not None and S == sparsities[0]:
            hit = [r for r in rs if np.isclose(r.budget, mark, rtol=1e-6)]
            if hit:
                r = hit[0]
                ci = "" if r.savings_ci is None else (
                    f"\n{100 * result.ci_level:.0f}% CI [{100 * r.savings_ci[0]:.3g}%, "
                    f"{100 * r.savings_ci[1]:.3g}%]")
                ci += "" if r.extrapolation_decades is None else (
                    f"\n{r.extrapolation_decades:.1f} decades beyond the data")
                ax.plot([r.budget], [100 * r.savings], marker="o", ms=7, mfc="none", mec="k", ls="none")
                ax.text(0.98, 0.04, f"at {mark:.0e} FLOPs: {100 * r.savings:.3g}%{ci}",
                        transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
                        bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.6", "lw": 0.5})
    if reference is not None:
        greys = ["0.35", "0.55", "0.7", "0.8"]
        ref_s = sorted({r.sparsity for r in reference.rows}, key=lambda s: -1 if s is None else s)
        for k, S in enumerate(ref_s):
            rs = sorted([r for r in reference.rows if r.sparsity == S], key=lambda r: r.budget)
            b = [r.budget for r in rs]
            lab = f"paper's laws{'' if S is None else f', S = {S:g}'}"
            ax.plot(b, [100 * r.savings for r in rs], color=greys[k % 4], lw=1.0, ls="--", label=lab)
            ax2.plot(b, [r.loss_gap for r in rs], color=greys[k % 4], lw=1.0, ls="--", label=lab)
    # The y range follows the point estimates (and the reference): far from the data a bootstrap
    # interval can run to -1e5 % (resamples clamped at the 6-decade bracket); it is cut at the axes.
    shown = [100 * r.savings for r in result.rows] + (
        [100 * r.savings for r in reference.rows] if reference is not None else [])
    lo_y, hi_y = min(min(shown), 0.0), max(max(shown), 0.0)
    pad = 0.25 * max(hi_y - lo_y, 5.0)
    ax.set_ylim(max(lo_y - pad, -100.0), min(hi_y + pad, 100.0))
    budgets = np.array([r.budget for r in result.rows])
    xmax = budgets.max() * 1.5
    xmin = budgets.min() / 1.5
    for a in (ax, ax2):
        a.axhline(0, color="0.2", lw=0.8)
        _log(a, "x")
        whose = "candidate" if result.convention == "candidate-budget" else "reference"
        a.set_xlabel(f"training budget C (FLOPs, the {whose}'s)")
        if data_range is not None:
            _shade_extrapolation(a, data_range, (xmin, xmax))
        a.set_xlim(xmin, xmax)
    ax.set_ylabel(r"compute savings $1 - C_{cand}/C_{ref}$ (%)")
    ax.set_title("Training compute saved at equal optimal loss")
    ax2.set_ylabel(r"loss gap $L^*_{ref} - L^*_{cand}$ (nats/token)")
    ax2.set_title("Loss gap at equal compute")
    _fig_legend(fig, [ax, ax2], ncol=3)
    return fig


# -- mechanism analyses (results of scaling.analysis.mechanisms) -----------------------------------------
def _run_colours(results: Sequence[Any]) -> dict[str, str]:
    """The first run of each architecture in its colour, further runs the remaining colours."""
    out, used, extra = {}, set(), iter(_EXTRA * 3)
    for r in results:
        c = ARCH_COLOURS.get(r.arch)
        out[r.run] = c if c and c not in used else next(extra)
        used.add(out[r.run])
    return out


def _pass_labels(passes: Sequence[Any]) -> list[str]:
    looped = {p.layer for p in passes if p.pass_ > 1}
    return [f"L{p.layer}" + (f"·{p.pass_}" if p.layer in looped else "") for p in passes]


@_styled
def sink(results: Sequence[Any]) -> Figure:
    """Attention mass per layer pass (execution order), one panel per run: the mean mass on the
    BOS position (solid bars) and, for the Dyck probe, on the demonstration answers (hatched,
    beside it); the rest of the mass, on all other keys, is 1 minus these. Shaded: the passes of
    looped layers, labelled L<layer>·<pass>. The y axis is zoomed to the largest bar (stated in
    the label) so that small masses stay readable."""
    results = sorted(results, key=lambda r: (0 if r.arch == "baseline" else 1, r.run))
    if not results:
        raise UserError("no sink results to plot")
    colours = _run_colours(results)
    dyck = any(r.probe == "dyck" for r in results)
    fig, axes = _figure(1, len(results), 0.42 * sum(len(r.passes) for r in results) + 1.6 * len(results),
                        3.2, sharey=True, gridspec_kw={"width_ratios": [len(r.passes) for r in results]})
    top = max(max(p.bos_mass, p.answer_mass or 0.0) for r in results for p in r.passes)
    w = 0.38 if dyck else 0.7
    for ax, r in zip(axes[0], results):
        x = np.arange(len(r.passes))
        bos = np.array([p.bos_mass for p in r.passes])
        c = colours[r.run]
        xb = x - w / 2 if dyck else x
        ax.bar(xb, bos, color=c, label="BOS", width=w)
        for xi, v in zip(xb, bos):
            ax.text(xi, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
        if dyck:
            ans = np.array([np.nan if p.answer_mass is None else p.answer_mass for p in r.passes])
            ax.bar(x + w / 2, ans, color=c, alpha=0.45, hatch="///", edgecolor=c, width=w,
                   label="demonstration answers")
            for xi, v in zip(x + w / 2, ans):
                if np.isfinite(v):
                    ax.text(xi, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
        looped = [i for i, p in enumerate(r.passes) if sum(q.layer == p.layer for q in r.passes) > 1]
        if looped:
            ax.axvspan(min(looped) - 0.5, max(looped) + 0.5, color="0.5", alpha=0.1, lw=0)
        ax.set_xticks(x, _pass_labels(r.passes), rotation=45, fontsize=7)
        ax.set_xlim(-0.6, len(r.passes) - 0.4)
        ax.set_title(f"{r.run}\n({group_label(r.arch)})", fontsize=8)
        ax.set_xlabel("layer pass (execution order)")
        ax.grid(axis="x", visible=False)
    axes[0, 0].set_ylim(0, min(1.0, max(0.05, 1.25 * top)))
    axes[0, 0].set_ylabel("mean attention mass\n(rest: on other tokens)")
    _legend(axes[0, -1], fontsize=6.5, loc="upper right")
    probe = ("Dyck k-shot prompts (query line)" if dyck else "validation documents (queries t ≥ 1)")
    fig.suptitle(f"Attention sink per layer pass, {probe}; shaded: looped layers", fontsize=9.5)
    return fig


@_styled
def lengths(results: Sequence[Any], gain: Any | None = None) -> Figure:
    """Validation loss by document length and by token position (top, one line per run) and,
    with a Baseline/SMELT pair, SMELT's gain L_baseline - L_smelt per bucket with +-1 paired
    standard error (bottom; above 0: SMELT better)."""
    results = sorted(results, key=lambda r: (0 if r.arch == "baseline" else 1, r.run))
    if not results:
        raise UserError("no lengths results to plot")
    colours = _run_colours(results)
    nrow = 2 if gain is not None else 1
    fig, axes = _figure(nrow, 2, 8.4, 2.6 * nrow + 0.4, sharex="col")
    for j, by in enumerate(("length", "position")):
        ax = axes[0, j]
        labels = [b.label for b in results[0].buckets if b.by == by]
        for i, r in enumerate(results):
            bs = [b for b in r.buckets if b.by == by]
            ax.plot(range(len(bs)), [np.nan if b.loss is None else b.loss for b in bs],
                    marker=MARKERS[i % len(MARKERS)], color=colours[r.run],
                    label=f"{r.run} ({group_label(r.arch)})")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title("by document length" if by == "length" else "by token position in the window")
        _legend(ax, fontsize=6.5)
        xl = "document length (tokens)" if by == "length" else "token position"
        if gain is not None:
            gx = axes[1, j]
            gs = [g for g in gain.buckets if g.by == by]
            y = np.array([np.nan if g.gain is None else g.gain for g in gs])
            err = np.array([0.0 if g.gain_se is None else g.gain_se for g in gs])
            gx.errorbar(range(len(gs)), y, yerr=err, fmt="o-", color=ARCH_COLOURS["smelt"], capsize=3, ms=4)
            gx.axhline(0, color="0.2", lw=0.8)
            gx.set_ylabel("gain $L_{base} - L_{smelt}$\n(nats/token)")
            if by == "length" and gain.long_from:
                k = next((i for i, g in enumerate(gs) if g.lo >= gain.long_from), None)
                if k is not None:
                    gx.axvspan(k - 0.5, len(gs) - 0.5, color="0.5", alpha=0.08, lw=0)
                    ratio = ("" if gain.long_short_ratio is None
                             else f"; gain long/short {gain.long_short_ratio:.2f}x")
                    gx.set_title(f"shaded: long documents (≥ {gain.long_from} tokens){ratio}", fontsize=8)
            bottom = gx
        else:
            bottom = ax
        bottom.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
        bottom.set_xlabel(xl)
    fig.suptitle(f"Loss by sample length and token position (context {results[0].seq_len} tokens)",
                 fontsize=9.5)
    return fig


@_styled
def icl(results: Sequence[Any]) -> Figure:
    """Dyck completion accuracy against the number of in-context demonstrations k (symlog x),
    Wilson binomial intervals as error bars, one line per run (slightly dodged)."""
    results = sorted(results, key=lambda r: (0 if r.arch == "baseline" else 1, r.run))
    if not results:
        raise UserError("no icl results to plot")
    colours = _run_colours(results)
    fig, axes = _figure(1, 1, 4.6, 3.2)
    ax = axes[0, 0]
    for i, r in enumerate(results):
        k = np.array([s.k for s in r.shots], dtype=float)
        acc = 100 * np.array([s.accuracy for s in r.shots])
        yerr = 100 * np.array([[s.accuracy - s.ci_low for s in r.shots],
                               [s.ci_high - s.accuracy for s in r.shots]])
        dodge = 1 + 0.04 * (i - (len(results) - 1) / 2)
        ax.errorbar(np.where(k > 0, k * dodge, (dodge - 1) * 2), acc, yerr=yerr,
                    marker=MARKERS[i % len(MARKERS)], capsize=3, color=colours[r.run], ms=4,
                    label=f"{r.run} ({group_label(r.arch)})")
    ax.set_xscale("symlog", linthresh=1)
    ks = sorted({s.k for r in results for s in r.shots})
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("in-context demonstrations k")
    r0 = results[0]
    ax.set_ylabel(f"exact-match accuracy (%)\n{100 * r0.confidence:.0f}% Wilson interval, "
                  f"{r0.n_trials} trials")
    top = max(100 * s.ci_high for r in results for s in r.shots)
    ax.set_ylim(0, min(100, max(10.0, 1.15 * top)))
    t = r0.task
    ax.set_title(f"Dyck completion, {t.get('n_types')} bracket types, "
                 f"{t.get('min_pairs')}-{t.get('max_pairs')} pairs", fontsize=9)
    _legend(ax, fontsize=6.5, loc="upper left")
    return fig


# -- saved analyses --------------------------------------------------------------------------
ANALYSIS_KINDS = ("sink", "sink_dyck", "lengths", "lengths_gain", "icl")


def saved_analyses(runs_dir: str | Path, kind: str) -> list[tuple[Path, Any]]:
    """Every saved ``runs/<run>/analysis/<kind>.json`` under ``runs_dir`` as (run folder, result),
    read with ``scaling.analysis.mechanisms.load_result``; [] when there is none."""
    if kind not in ANALYSIS_KINDS:
        raise UserError(f"unknown analysis kind {kind!r}; one of {', '.join(ANALYSIS_KINDS)}")
    files = sorted(Path(runs_dir).rglob(f"analysis/{kind}.json"))
    if not files:
        return []
    from scaling.analysis.mechanisms import load_result

    out = []
    for f in files:
        try:
            out.append((f.parent.parent, load_result(f.parent.parent, kind)))
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read {f}: {exc}") from None
    return out


# -- paired comparison (a scaling.fitting.compare.CompareResult) -------------------------------------
@_styled
def compare(result: Any) -> Figure:
    """Paired candidate - reference validation loss (nats/token) at matched (tier, budget, seed).

    Left: every pair against its budget in tokens, one shade per tier (seeds as markers), the
    cell means joined per tier. Right: mean ± 1 clustered s.e. overall, per tier and per budget.
    Below zero the candidate is better.
    """
    pairs = result.pairs
    c_cand = ARCH_COLOURS.get(result.candidate, _EXTRA[0])
    tiers = [s.label for s in result.by_tier]
    colours = dict(zip(tiers, shades(c_cand, len(tiers))))
    fig, axes = _figure(1, 2, 8.4, 3.2, gridspec_kw={"width_ratios": [1.3, 1.0]})
    ax, ax2 = axes[0]
    seeds = sorted(pairs["seed"].unique(), key=str)
    x_col = "tokens" if "tokens" in pairs else "budget_index"
    for t in tiers:
        sub = pairs[pairs["tier"].astype(str) == t]
        for j, s in enumerate(seeds):
            ss = sub[sub["seed"] == s]
            ax.plot(ss[x_col], ss["diff"], ls="none", marker=MARKERS[j % len(MARKERS)], ms=3.5,
                    color=colours[t], alpha=0.8)
        cell = sub.groupby("budget_index").agg(x=(x_col, "mean"), d=("diff", "mean"))
        ax.plot(cell["x"], cell["d"], color=colours[t], lw=1.2, label=t)
    ax.axhline(0, color="0.2", lw=0.8)
    if x_col == "tokens":
        _log(ax, "x")
        ax.set_xlabel("training tokens (budget)")
    else:
        ax.set_xlabel("budget index")
    ax.set_ylabel(f"{group_label(result.candidate)} − {group_label(result.reference)} loss (nats/token)")
    ax.set_title("Paired differences (markers: seeds; lines: cell means)")
    _legend(ax, fontsize=6, ncol=2)
    rows = [result.overall, *result.by_tier, *result.by_budget]
    labels = [r.label if r.tokens is None or not r.label.startswith("budget")
              else f"{si(r.tokens)} tokens" for r in rows]
    y = np.arange(len(rows))[::-1]
    for yi, r in zip(y, rows):
        colour = "k" if r is result.overall else colours.get(r.label, "0.4")
        err = 0.0 if r.se is None else r.se
        ax2.errorbar([r.mean], [yi], xerr=[err], fmt="o", ms=4, color=colour, capsize=2, lw=1)
    ax2.axvline(0, color="0.2", lw=0.8)
    ax2.set_yticks(y, labels, fontsize=7)
    ax2.set_xlabel("mean difference ± 1 s.e. (nats/token)")
    ax2.set_title(f"s.e. clustered by {result.cluster}")
    return fig


# -- held-out extrapolation check (scaling.fitting.holdout) ------------------------------------
@_styled
def holdout(result: Any) -> Figure:
    """Predicted vs observed loss of held-out points (``scaling.fitting.holdout.HoldoutResult``).

    Left: observed against predicted (nats), one marker per point coloured by group, with its
    bootstrap prediction interval as a horizontal bar, and the diagonal y = x. Right: the error in
    log loss, log(observed / predicted), against total compute, with the interval as bars; points
    outside their interval are hollow.
    """
    df = result.heldout
    groups = _order(df["group"])
    colours = group_colours(groups)
    fig, axes = _figure(1, 2, 7.2, 3.2)
    ax, ax2 = axes[0]
    for g in groups:
        s = df[df["group"] == g]
        col = colours[g]
        has = np.isfinite(s["lo"].to_numpy(dtype=float))
        if has.any():
            ax.errorbar(s["predicted"], s["observed"],
                        xerr=[s["predicted"] - s["lo"], s["hi"] - s["predicted"]],
                        fmt="none", ecolor=col, elinewidth=0.8, alpha=0.6)
            ax2.errorbar(s["compute"], np.zeros(len(s)),
                         yerr=[np.log(s["predicted"] / s["lo"]), np.log(s["hi"] / s["predicted"])],
                         fmt="none", ecolor=col, elinewidth=0.8, alpha=0.4)
        inside = s["inside"].map(lambda v: v is not False).to_numpy(dtype=bool)
        for mask, face in ((inside, col), (~inside, "none")):
            if mask.any():
                ax.plot(s["predicted"][mask], s["observed"][mask], ls="none", marker="o", ms=4.5, mfc=face,
                        mec=col, label=group_label(g) if face == col else None)
                ax2.plot(s["compute"][mask], s["error_log"][mask], ls="none", marker="o", ms=4.5, mfc=face,
                         mec=col)
    lo = float(np.nanmin(df[["observed", "predicted"]].to_numpy()))
    hi = float(np.nanmax(df[["observed", "predicted"]].to_numpy()))
    pad = 0.05 * (hi - lo or hi)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.4", lw=0.8, ls="--")
    ax.set_xlabel("predicted loss (nats)")
    ax.set_ylabel("observed loss (nats)")
    ax.set_title(f"held out: {result.rule}", fontsize=9)
    _legend(ax, fontsize=7)
    ax2.axhline(0, color="0.4", lw=0.8, ls="--")
    _log(ax2, "x")
    ax2.set_xlabel("training compute C (FLOPs)")
    ax2.set_ylabel("log(observed / predicted)")
    ax2.set_title(f"{100 * result.level:.0f}% prediction intervals (hollow: outside)", fontsize=9)
    return fig

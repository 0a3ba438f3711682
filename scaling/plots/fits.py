"""Fitted laws: data and law per group, log residuals, parameters with their bootstrap intervals,
IsoFLOP profiles (the slices from ``scaling.fitting.slices``) and the compute-optimal frontier.
The functions draw what the library computed (and evaluate a fitted law on a grid to draw it)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from scaling.common.errors import UserError
from scaling.common.stats import percentile_interval
from scaling.fitting.tables import group_rows, law_inputs, total_flops
from scaling.plots.style import (
    LEVEL_MARKERS,
    MARKERS,
    fig_legend,
    figure,
    group_colours,
    group_label,
    legend,
    log_axis,
    order,
    shade_extrapolation,
    shades,
    si,
    styled,
)

PARAM_LABELS = {
    "E": r"$E$ (nats/token)", "A": r"$A$", "alpha": r"$\alpha$", "B": r"$B$", "beta": r"$\beta$",
    "a": r"$a=\beta/(\alpha+\beta)$  ($N^*\propto C^a$)",
    "b": r"$b=\alpha/(\alpha+\beta)$  ($D^*\propto C^b$)",
    "frontier_exponent": r"frontier exponent $\alpha\beta/(\alpha+\beta)$",
    "K": r"$K$", "c": r"$c$", "f_exponent": r"$F^*$ exponent $c/(a+c)$",
    "d_exponent": r"$D^*$ exponent $a/(a+c)$",
}


def _inputs(fit: Any, df: pd.DataFrame) -> dict[str, np.ndarray]:
    return law_inputs(df, fit.law_obj.inputs, source=f"group {fit.group!r}")


MAX_LEVELS = 8   # lines and legend entries per panel that stay readable


def _levels(values: np.ndarray, rel: float = 0.02, at_most: int = MAX_LEVELS) -> np.ndarray:
    """Distinct levels of a quantity, merging values within ``rel`` of each other.

    More than ``at_most`` levels (an IsoFLOP design gives every size its own token counts) are
    binned into ``at_most`` equal bins in log space, each level the geometric mean of the values
    in its bin, so a panel keeps one line per bin and its points sit near (not on) their line.
    """
    v = np.sort(np.unique(values))
    out = [v[0]]
    for x in v[1:]:
        if x > out[-1] * (1 + rel):
            out.append(x)
    if len(out) <= at_most:
        return np.array(out)
    logs = np.log(v)
    edges = np.linspace(logs[0], logs[-1], at_most + 1)
    idx = np.clip(np.searchsorted(edges, logs, side="right") - 1, 0, at_most - 1)
    return np.array([np.exp(logs[idx == k].mean()) for k in range(at_most) if (idx == k).any()])


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
    # say what `smelt-scale fit` warns about, in its words: a misfit, a parameter on its bound
    gof = d.get("goodness_of_fit") or {}
    flags = []
    if gof.get("misfit"):
        flags.append(f"MISFIT (trend in the residuals, p = {gof['p_value']:.1g})")
    if d.get("on_bound"):
        flags.append(f"{', '.join(d['on_bound'])} on its bound")
    if not d.get("identified", True):
        flags.append("not identified")
    return (f"{head}\n{fit.n_points} points, RMSE(log L) {d['rmse_log']:.3f}"
            + ("" if not flags else "\n" + "; ".join(flags)))


def _plot_law(ax: Any, x: np.ndarray, y: np.ndarray, lo: float, hi: float, colour: Any) -> None:
    """The law solid inside the data's range [lo, hi] and dotted beyond it (an extrapolation)."""
    inside = (x >= lo) & (x <= hi)
    ax.plot(x[inside], y[inside], color=colour, lw=1.2)
    for part in (x <= lo, x >= hi):
        if part.sum() > 1:
            ax.plot(x[part], y[part], color=colour, lw=1.0, ls=":")


def law_band(fit: Any, **inputs: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Percentile band of the predicted loss over the fit's bootstrap parameter samples at
    ``settings["ci_level"]`` (``scaling.common.stats.percentile_interval`` across resamples, per
    input point), or None when the fit has no bootstrap samples (then no band is drawn)."""
    if fit.bootstrap.shape[0] == 0:
        return None
    with np.errstate(all="ignore"):
        samples = fit.predict_bootstrap(**inputs)
    lo, hi = percentile_interval(samples, fit.settings.get("ci_level", 0.95), axis=0)
    return (lo, hi) if np.isfinite(lo).any() else None


def _plot_band(ax: Any, x: np.ndarray, band: tuple[np.ndarray, np.ndarray] | None, colour: Any) -> None:
    if band is not None:
        ax.fill_between(x, band[0], band[1], color=colour, alpha=0.15, lw=0, gid="bootstrap band")


@styled
def fits(points: pd.DataFrame, fits: Mapping[str, Any], *, groups: Sequence[str] | None = None) -> Figure:
    """Data and fitted law per group (one row each): loss vs tokens D at each size N (left) and
    loss vs N at each D (right). Markers: the fitted points; lines: the law through them.

    Chinchilla-form fits draw the law continuously in both N and D; a law in other inputs
    (the smelt form's F, S) draws it in D and through the observed sizes in N. Around each law
    line drawn on a grid: the bootstrap percentile band of the predicted loss (``law_band``),
    where the fit has bootstrap samples.
    """
    groups = order(groups or [g for g in fits if (points["group"] == g).any()])
    if not groups:
        raise UserError("no group has both points and a fit")
    colours = group_colours(groups)
    fig, axes = figure(len(groups), 2, 8.2, 3.0 * len(groups) + 0.3)
    for row, g in enumerate(groups):
        fit, sub = fits[g], group_rows(points, g)
        Ns = _levels(sub["N"].to_numpy(), at_most=2 * MAX_LEVELS)   # trained sizes: few, each its own line
        Ds = _levels(sub["D"].to_numpy())
        binned = len(Ds) < len(_levels(sub["D"].to_numpy(), at_most=len(sub)))
        ni, di = _nearest(sub["N"].to_numpy(), Ns), _nearest(sub["D"].to_numpy(), Ds)
        cN, cD = shades(colours[g], len(Ns)), shades(colours[g], len(Ds))
        ax = axes[row, 0]
        dgrid = np.geomspace(Ds[0] / 1.6, Ds[-1] * 1.6, 80)
        for i, N in enumerate(Ns):
            m = ni == i
            one = sub[m].iloc[[0]]
            X = {k: np.full_like(dgrid, v[0]) for k, v in _inputs(fit, one).items()}
            X["D"] = dgrid
            _plot_band(ax, dgrid, law_band(fit, **X), cN[i])
            _plot_law(ax, dgrid, fit.predict(**X), Ds[0], Ds[-1], cN[i])
            ax.plot(sub.loc[m, "D"], sub.loc[m, "loss"], ls="none", marker=MARKERS[i % len(MARKERS)],
                    color=cN[i], mec="0.15", mew=0.4, label=f"N = {si(N)}")
        log_axis(ax, "x")
        ax.set_xlabel("training tokens D")
        ax.set_ylabel(f"{group_label(g)}\nvalidation loss (nats/token)")
        legend(ax, loc="upper right", title="active params", title_fontsize=7, fontsize=6.5, ncol=2)
        ax.text(0.02, 0.03, _param_text(fit), transform=ax.transAxes, fontsize=7, va="bottom")
        ax = axes[row, 1]
        ngrid = np.geomspace(Ns[0] / 1.6, Ns[-1] * 1.6, 80)
        for j, D in enumerate(Ds):
            m = di == j
            if fit.law_obj.inputs == ("N", "D"):
                X = {"N": ngrid, "D": np.full_like(ngrid, D)}
                _plot_band(ax, ngrid, law_band(fit, **X), cD[j])
                _plot_law(ax, ngrid, fit.predict(**X), Ns[0], Ns[-1], cD[j])
            else:
                at = sub[m].sort_values("N")
                ax.plot(at["N"], fit.predict(**_inputs(fit, at)), color=cD[j], lw=1.2)
            ax.plot(sub.loc[m, "N"], sub.loc[m, "loss"], ls="none", marker=MARKERS[j % len(MARKERS)],
                    color=cD[j], mec="0.15", mew=0.4, label=f"D {'≈' if binned else '='} {si(D)}")
        log_axis(ax, "x")
        ax.set_xlabel("active non-embedding parameters N")
        ax.set_ylabel("validation loss (nats/token)")
        legend(ax, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="tokens", title_fontsize=7)
    boot = any(fits[g].bootstrap.shape[0] for g in groups)
    fig.suptitle("Scaling-law fits (approach 3, Huber on log loss): data and fitted law "
                 "(dotted: beyond the data" + ("; band: bootstrap percentile interval" if boot else "") + ")",
                 fontsize=10)
    return fig


@styled
def residuals(points: pd.DataFrame, fits: Mapping[str, Any], *,
              groups: Sequence[str] | None = None) -> Figure:
    """Log residuals log L - log L_hat of every fitted point against D, one panel per group,
    shades and markers by size N; the band is +-RMSE. A log residual of 0.01 is a 1% error."""
    groups = order(groups or [g for g in fits if (points["group"] == g).any()])
    colours = group_colours(groups)
    fig, axes = figure(1, len(groups), 3.6 * len(groups) + 0.3, 3.0, sharey=True)
    for ax, g in zip(axes[0], groups):
        fit, sub = fits[g], group_rows(points, g)
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
        log_axis(ax, "x")
        ax.set_xlabel("training tokens D")
        ax.set_title(f"{group_label(g)}: RMSE {rmse:.4f}, max |r| {np.abs(r).max():.4f}")
        legend(ax, fontsize=6.5, loc="best")
    axes[0, 0].set_ylabel(r"log residual $\log L - \log \hat L$  (≈ relative error)")
    return fig


@styled
def params(fits: Mapping[str, Any], *, names: Sequence[str] | None = None) -> Figure:
    """Fitted parameters and derived exponents per group: estimate (large marker), bootstrap
    percentile interval (bar) and the bootstrap resamples (dots). Scale factors on log axes."""
    groups = order(fits)
    colours = group_colours(groups)
    first = fits[groups[0]]
    law = first.law_obj
    names = list(names or [*law.params, *law.derive(first.params)])   # the law's exponents, not G, H
    ncol = 4
    nrow = math.ceil(len(names) / ncol)
    fig, axes = figure(nrow, ncol, 8.4, 2.3 * nrow + 0.4)
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
            log_axis(ax, "y")
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



@styled
def isoflop(slices: pd.DataFrame, points: pd.DataFrame, fits: Mapping[str, Any] | None = None) -> Figure:
    """IsoFLOP profiles (approach 2) per group, and the compute-optimal size N*(C) of both.

    ``slices``: ``scaling.fitting.slices.isoflop_slices(points)``; ``points``: the fitted points.
    Per group panel: loss at fixed compute against N (markers, the slices),
    the parabola in log N through them (dashed) with its vertex (diamond) where
    ``scaling.fitting.approaches.isoflop_optima`` accepts it (convex, inside the sampled sizes), and, for
    a chinchilla-form fit, the fitted law along the same compute (solid; D = C / F(N), F(N) the
    fit's per-token FLOPs model, ``FitResult.cost``) with its minimum (star). Last panel: N*(C) of
    the law (``FitResult.optimal``, the frontier ``scaling.fitting.savings`` uses) and the parabola
    vertices.
    """
    from scaling.fitting.approaches import isoflop_optima

    sl = slices
    groups = order(sl["group"])
    colours = group_colours(groups)
    levels_ = np.sort(sl["compute"].unique())
    fig, axes = figure(1, len(groups) + 1, 3.1 * (len(groups) + 1) + 0.3, 3.2)
    nstar_ax = axes[0, -1]
    for ax, g in zip(axes[0], groups):
        s = sl[sl["group"] == g]
        gp = points[points["group"] == g]
        fit = None if fits is None else fits.get(g)
        cl = shades(colours[g], len(levels_))
        ngrid = np.geomspace(gp["N"].min() / 2.5, gp["N"].max() * 2.5, 200)
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
                Lc = fit.predict(N=ngrid, D=C / fit.cost(ngrid))
                ax.plot(ngrid, Lc, color=cl[i], lw=1.1)
                j = int(np.argmin(Lc))
                ax.plot([ngrid[j]], [Lc[j]], marker="*", color=cl[i], mec="k", ms=10, ls="none")
        log_axis(ax, "x")
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
            nstar_ax.plot(cgrid, fit.optimal(cgrid)["N"], color=c,
                          label=f"{group_label(g)}: law, C = ({fit.cost.describe()})·D")
        if vtx:
            nstar_ax.plot([v[0] for v in vtx], [v[1] for v in vtx], marker="D", color=c, mec="k", ls="none",
                          label=f"{group_label(g)}: parabola vertices")
    for N in np.unique(points["N"]):
        nstar_ax.axhline(N, color="0.7", lw=0.5, ls=":")
    log_axis(nstar_ax, "x")
    log_axis(nstar_ax, "y")
    nstar_ax.set_xlabel("training compute C (FLOPs)")
    nstar_ax.set_ylabel("compute-optimal N* (active params)")
    nstar_ax.set_title("N*(C); dotted: the trained sizes")
    legend(nstar_ax, fontsize=6, loc="upper left")
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



@styled
def frontier(fits: Mapping[str, Any], points: pd.DataFrame | None = None, *, c_max: float = 1e22,
             sparsity: float | None = None, level: float = 0.95) -> Figure:
    """Compute-optimal frontier of every group: L*(C) (left) and the optimal size and tokens
    (right), from ``scaling.fitting.savings.frontier`` (C = F(N) D with the fit's FLOPs-per-token
    model for the chinchilla form, C = F D for the smelt form at ``sparsity``), with the bootstrap
    percentile band. Markers: the fitted points at their recorded FLOPs. Right of the dotted line
    (the largest fitted compute) everything is extrapolation."""
    from scaling.fitting.savings import FittedLaw
    from scaling.fitting.savings import frontier as law_frontier

    groups = order(fits)
    colours = group_colours(groups)
    laws = {g: FittedLaw.from_fit(fits[g], name=g) for g in groups}
    cmin = min(l.compute_min or 1e18 for l in laws.values())
    cmax_data = max(l.compute_max or 0.0 for l in laws.values()) or None
    C = np.geomspace(cmin / 3, max(c_max, 3 * (cmax_data or cmin)), 300)
    fig, axes = figure(1, 2, 8.4, 3.3)
    ax, ax2 = axes[0]
    for i, g in enumerate(groups):
        law, c = laws[g], colours[g]
        opt = law_frontier(law.law, law.theta, C, cost=law.cost, S=sparsity)
        ax.plot(C, opt.loss, color=c, label=f"{group_label(g)}: L*(C)")
        if law.samples is not None:
            ob = law_frontier(law.law, law.samples[:, None, :], C[None, :], cost=law.cost, S=sparsity)
            lo, hi = percentile_interval(ob.loss, level, axis=0)
            ax.fill_between(C, lo, hi, color=c, alpha=0.18, lw=0)
            lo, hi = percentile_interval(ob.size, level, axis=0)
            ax2.fill_between(C, lo, hi, color=c, alpha=0.12, lw=0)
        ax2.plot(C, opt.size, color=c, label=f"{group_label(g)}: {'N*' if opt.size_name == 'N' else 'F*'}")
        ax2.plot(C, opt.tokens, color=c, ls="--", label=f"{group_label(g)}: D*")
        ax.axhline(law.params["E"], color=c, lw=0.7, ls=(0, (1, 2)))
        if points is not None:
            p = points[points["group"] == g]
            ax.plot(total_flops(p, law.cost), p["loss"], ls="none", marker=MARKERS[i], ms=3.5,
                    mfc="none", mec=c, alpha=0.8, label=f"{group_label(g)}: fitted points")
    for a in (ax, ax2):
        log_axis(a, "x")
        a.set_xlabel("training compute C (FLOPs)")
        shade_extrapolation(a, (cmin, cmax_data), (C[0], C[-1]))
        a.set_xlim(C[0], C[-1])
    log_axis(ax2, "y")
    ax.set_ylabel("compute-optimal loss L* (nats/token)")
    ax.set_title("Frontier L*(C); dotted horizontals: fitted E")
    size = "N* (params)" if opt.size_name == "N" else "F* (FLOPs/token)"
    ax2.set_ylabel(f"optimal {size} and D* (tokens)")
    ax2.set_title("Optimal allocation")
    fig_legend(fig, [ax, ax2], ncol=4)
    return fig


# -- held-out extrapolation check (scaling.fitting.holdout) ------------------------------------
@styled
def holdout(result: Any) -> Figure:
    """Predicted vs observed loss of held-out points (``scaling.fitting.holdout.HoldoutResult``).

    Left: observed against predicted (nats), one marker per point coloured by group, with its
    bootstrap prediction interval as a horizontal bar, and the diagonal y = x. Right: the error in
    log loss, log(observed / predicted), against total compute, with the interval as bars; points
    outside their interval are hollow.
    """
    df = result.heldout
    groups = order(df["group"])
    colours = group_colours(groups)
    fig, axes = figure(1, 2, 7.2, 3.2)
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
    legend(ax, fontsize=7)
    ax2.axhline(0, color="0.4", lw=0.8, ls="--")
    log_axis(ax2, "x")
    ax2.set_xlabel("training compute C (FLOPs)")
    ax2.set_ylabel("log(observed / predicted)")
    ax2.set_title(f"{100 * result.level:.0f}% prediction intervals (hollow: outside)", fontsize=9)
    return fig

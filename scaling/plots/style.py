"""The house style of the figures: rc settings, colours, markers, and the small drawing helpers
every figure module shares.

Conventions, for print: every axis labelled with its unit; log scales where a quantity spans
decades (tokens, FLOPs, parameters); Baseline always Okabe & Ito blue and SMELT vermillion
(colour-blind safe), other groups the rest of seaborn's "colorblind" palette; sizes within an
architecture as light-to-dark shades of its colour plus distinct markers, so they stay apart in
greyscale. Figures are built on ``Figure`` objects, not pyplot, so a loop of them leaks no state.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import matplotlib as mpl
import numpy as np
import seaborn as sns
from matplotlib.figure import Figure

from scaling.accounting.tiers import ARCHS
from scaling.common.errors import UserError
from scaling.common.format import si
from scaling.common.run_folder import atomic_write

__all__ = ["ARCH_COLOURS", "ARCH_LABELS", "EXTRA", "LEVEL_MARKERS", "MARKERS", "RC", "fig_legend", "figure",
           "group_colours", "group_label", "legend", "log_axis", "order", "run_colours", "save",
           "shade_extrapolation", "shades", "si", "styled"]

ARCH_COLOURS = {"baseline": "#0072B2", "smelt": "#D55E00"}
ARCH_LABELS = {"baseline": "Baseline", "smelt": "SMELT"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LEVEL_MARKERS = ("o", "s", "^", "v", "P", "X")   # IsoFLOP levels: D and * mark the minima there
EXTRA = [c for c in sns.color_palette("colorblind").as_hex() if c.lower() not in ("#0173b2", "#d55e00")]
EXTRAPOLATION_SHADE = "#000000"

RC = {
    **sns.axes_style("ticks"),
    "font.size": 9, "axes.labelsize": 9, "axes.titlesize": 9.5, "legend.fontsize": 7.5,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "lines.linewidth": 1.5, "lines.markersize": 5,
    "axes.grid": True, "grid.alpha": 0.35, "grid.linewidth": 0.5, "axes.spines.top": False,
    "axes.spines.right": False, "legend.frameon": False, "figure.dpi": 120, "savefig.dpi": 200,
    "savefig.bbox": "tight", "image.cmap": "viridis",
}



def styled(fn: Callable[..., Figure]) -> Callable[..., Figure]:
    """Draw inside the paper rc context (fonts and spines are read when artists are created)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with mpl.rc_context(RC):
            return fn(*args, **kwargs)

    return wrapper


def figure(nrows: int, ncols: int, width: float, height: float, **kw: Any):
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
            # a tmp file replaced at the end: a failed or killed write keeps the previous figure whole
            atomic_write(path, lambda fh: fig.savefig(fh, format=path.suffix.lower()[1:], dpi=dpi))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot write the figure {path}: {exc}") from None
    return path


def group_colours(groups: Iterable[str]) -> dict[str, str]:
    """Baseline blue, SMELT vermillion, any other group the next colour-blind-safe colour."""
    out, extra = {}, iter(EXTRA * 3)
    for g in groups:
        out[g] = ARCH_COLOURS.get(g) or next(extra)
    return out


def group_label(g: str) -> str:
    return ARCH_LABELS.get(g, g)


def order(groups: Iterable[str]) -> list[str]:
    """Baseline, SMELT, then any other group by name."""
    rank = {a: i for i, a in enumerate(ARCHS)}
    return sorted(set(groups), key=lambda g: (rank.get(g, len(ARCHS)), str(g)))


def shades(colour: str, n: int) -> list[tuple[float, float, float]]:
    """n shades of one colour, light (smallest) to dark (largest); the lightest still prints."""
    base = np.array(mpl.colors.to_rgb(colour))
    light, dark = base + 0.55 * (1 - base), 0.55 * base
    if n == 1:
        return [tuple(base)]
    return [tuple(c) for c in sns.blend_palette([light, base, dark], n)]



def log_axis(ax, axis: str = "x") -> None:
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


def legend(ax, **kw: Any) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(**kw)


def fig_legend(fig: Figure, axes: Sequence[Any], ncol: int = 4) -> None:
    """One legend below the panels with every distinct label of ``axes`` (keeps the data clear)."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if not lab.startswith("_") and lab not in seen:
                seen[lab] = h
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=min(ncol, len(seen)),
                   fontsize=7)


def shade_extrapolation(ax, data_range: tuple[float | None, float | None],
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



def run_colours(results: Sequence[Any]) -> dict[str, str]:
    """The first run of each architecture in its colour, further runs the remaining colours."""
    out, used, extra = {}, set(), iter(EXTRA * 3)
    for r in results:
        c = ARCH_COLOURS.get(r.arch)
        out[r.run] = c if c and c not in used else next(extra)
        used.add(out[r.run])
    return out


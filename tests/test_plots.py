"""scaling.plots and `smelt-scale plot` on a small synthetic runs folder (known law, seconds)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from cli import app
from scaling import plots
from scaling.common.errors import UserError
from scaling.fitting.curves import CURVE_COLUMNS, read_curves
from scaling.fitting.fit import fit_groups
from scaling.fitting.laws import get_law
from scaling.fitting.savings import FittedLaw
from scaling.fitting.savings import frontier as law_frontier
from scaling.fitting.savings_sweep import savings_over
from scaling.fitting.slices import isoflop_slices
from scaling.fitting.tables import load_points

runner = CliRunner()
CHIN = get_law("chinchilla")
# Both groups follow this law; SMELT with a smaller A (so it is better at equal N, D).
LAW = {"E": 1.9, "alpha": 0.34, "B": 410.0, "beta": 0.31}
A = {"baseline": 300.0, "smelt": 260.0}
SIZES = {"xs": 8.0e4, "s": 1.6e5, "m": 3.2e5, "l": 6.4e5}
BUDGETS = [1.25e5, 2.5e5, 5e5, 1e6]
BATCH = 4096


def law_loss(arch: str, N: float, D: float) -> float:
    return float(CHIN.predict({**LAW, "A": A[arch]}, N=N, D=D))


def write_runs(root: Path, noise: float = 0.002, seed: int = 0) -> Path:
    """A trainer-style runs folder: config.json, metrics.jsonl (trunk, branches, evals), final.json."""
    rng = np.random.default_rng(seed)
    for tier, N in SIZES.items():
        for arch in ("baseline", "smelt"):
            name = f"proxy-{tier}-{arch}-s0"
            run = root / name
            run.mkdir(parents=True)
            F = 16.0 * N + 1.0e6
            (run / "config.json").write_text(json.dumps({
                "run": name, "tier": f"proxy-{tier}", "arch": arch,
                "accounting": {"active_params": N, "flops_per_token": F}}))
            lines, points = [], []
            steps = int(BUDGETS[-1] // BATCH)
            for step in range(1, steps + 1):
                tok = step * BATCH
                row = {"iter": step, "step": step, "tokens": tok, "branch": None,
                       "train_loss": law_loss(arch, N, tok) + 0.05, "lr": 1e-3}
                if step % 50 == 0:
                    row["val_loss"] = law_loss(arch, N, tok)
                lines.append(row)
            for b, budget in enumerate(BUDGETS):
                tok = int(budget // BATCH) * BATCH
                loss = law_loss(arch, N, tok) * float(np.exp(noise * rng.standard_normal()))
                lines.append({"iter": 10_000 + b, "step": tok // BATCH, "tokens": tok,
                              "branch": None if b == len(BUDGETS) - 1 else b, "train_loss": loss + 0.03,
                              "val_loss": loss, "val_bpb": loss / np.log(2) / 4, "budget_index": b,
                              "lr": 1e-4})
                points.append({"N": N, "D": tok, "loss": loss, "flops": F * tok, "flops_per_token": F,
                               "sparsity": 0.7, "budget_index": b})
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
            (run / "final.json").write_text(json.dumps({"run": name, "arch": arch, "tier": f"proxy-{tier}",
                                                        "complete": True, "points": points}))
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return write_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def points(runs) -> pd.DataFrame:
    return load_points(runs)


@pytest.fixture(scope="module")
def fits(points):
    # starts around the truth keep the multistart to a few dozen starts (the full grid is tested in test_fit)
    z0 = np.array([CHIN.to_internal({**LAW, "A": a}) for a in A.values()])
    starts = np.concatenate([z0 + d for d in (0.0, 0.3, -0.3)])
    return fit_groups(points, n_bootstrap=20, seed=0, cross_checks=False, starts=starts)


def visible(fig: Figure):
    return [ax for ax in fig.axes if ax.get_visible()]


def hue_is(colour, arch: str) -> bool:
    r, _, b = matplotlib.colors.to_rgb(colour)
    return b > r if arch == "baseline" else r > b


# -- data --------------------------------------------------------------------------------------
def test_read_curves_columns_branches_and_torn_line(runs, tmp_path):
    c = read_curves(runs)
    assert list(c.columns) == list(CURVE_COLUMNS)
    assert c["run"].nunique() == 8
    assert str(c["branch"].dtype) == "Int64" and c["branch"].isna().any() and c["branch"].notna().any()
    one = c[c["run"] == "proxy-m-smelt-s0"]
    np.testing.assert_allclose(one["flops"], one["tokens"] * (16.0 * SIZES["m"] + 1.0e6))
    assert (c.groupby("run")["budget_index"].count() == len(BUDGETS)).all()
    # a log being written: its torn last line is skipped, the run stays
    copy = write_runs(tmp_path / "r")
    with open(copy / "proxy-xs-smelt-s0" / "metrics.jsonl", "a") as fh:
        fh.write('{"iter": 99999, "step": 1, "tok')
    (copy / "proxy-xs-smelt-s0" / "final.json").unlink()
    c2 = read_curves(copy)
    xs = c2[c2["run"] == "proxy-xs-smelt-s0"]
    assert len(xs) == len(c[c["run"] == "proxy-xs-smelt-s0"]) and not xs["complete"].any()


def test_read_curves_errors(tmp_path):
    with pytest.raises(UserError, match="no such runs folder"):
        read_curves(tmp_path / "absent")
    with pytest.raises(UserError, match="no training logs"):
        read_curves(tmp_path)


# -- figures -------------------------------------------------------------------------------------
@pytest.mark.parametrize("x, label", [("tokens", "training tokens"), ("flops", "FLOPs")])
def test_loss_curves_panels_axes_colours(runs, x, label):
    fig = plots.loss_curves(read_curves(runs), x=x)
    axes = [ax for ax in visible(fig) if ax.get_title()]    # the loss panels; below each, its difference
    assert isinstance(fig, Figure) and len(axes) == len(SIZES) and len(visible(fig)) == 2 * len(SIZES)
    for ax in axes:
        assert ax.get_xscale() == "log" and label in ax.get_xlabel()
    assert "nats/token" in axes[0].get_ylabel()
    titles = [ax.get_title() for ax in axes]
    assert [t.split("\n")[0] for t in titles] == [f"proxy-{t}" for t in SIZES]   # smallest first
    colours = {matplotlib.colors.to_hex(line.get_color()) for line in axes[0].lines}
    assert {plots.ARCH_COLOURS["baseline"].lower(), plots.ARCH_COLOURS["smelt"].lower()} <= colours
    with pytest.raises(UserError, match="x must be"):
        plots.loss_curves(read_curves(runs), x="steps")


def test_loss_curves_difference_row_is_smelt_minus_baseline_by_hand(runs):
    """Below each tier's panel: SMELT - Baseline validation loss at matched budgets, from the two
    runs' metrics.jsonl read by hand, with the zero line; tick labels on every panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    def ends(name):
        rows = [json.loads(ln) for ln in (runs / name / "metrics.jsonl").read_text().splitlines()]
        return {r["budget_index"]: (r["tokens"], r["val_loss"]) for r in rows
                if r.get("budget_index") is not None}

    base, smelt = ends("proxy-m-baseline-s0"), ends("proxy-m-smelt-s0")
    hand = [smelt[b][1] - base[b][1] for b in sorted(base)]
    fig = plots.loss_curves(read_curves(runs))
    FigureCanvasAgg(fig).draw()
    axes = visible(fig)
    panel = next(i for i, ax in enumerate(axes) if ax.get_title().startswith("proxy-m\n"))
    ncol = 4
    dax = axes[ncol + panel] if panel < ncol else axes[2 * ncol + panel]   # the row below it
    assert "SMELT − Baseline" in axes[ncol].get_ylabel()
    line = next(ln for ln in dax.lines if ln.get_label() == "no seed")      # the synthetic runs carry none
    np.testing.assert_allclose(line.get_xdata(), [base[b][0] for b in sorted(base)])
    np.testing.assert_allclose(line.get_ydata(), hand, rtol=1e-12)
    assert any(np.allclose(ln.get_ydata(), 0) and ln.get_xdata()[0] == 0 for ln in dax.lines)   # zero line
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            assert any(t.get_text() for t in axis.get_ticklabels() if t.get_visible()), ax.get_title()


def test_val_differences_pairs_seeds_and_budgets(runs, tmp_path):
    from scaling.fitting.curves import val_differences

    c = read_curves(runs)
    c["seed"] = pd.array([0 if r.endswith("-s0") else 1 for r in c["run"]], dtype="Int64")
    d = val_differences(c)
    assert set(d["tier"]) == {f"proxy-{t}" for t in SIZES} and (d["seed"] == 0).all()
    assert (d["budget_index"].notna()).sum() == len(SIZES) * len(BUDGETS)
    np.testing.assert_allclose(d["diff"], d["candidate_loss"] - d["reference_loss"])
    c.loc[c["arch"] == "smelt", "seed"] = 1      # no seed in common: nothing pairs, and no row is drawn
    assert val_differences(c).empty
    assert len(visible(plots.loss_curves(c))) == len(SIZES)


def test_fits_figure_rows_per_group_in_arch_colours(points, fits):
    fig = plots.fits(points, fits)
    axes = visible(fig)
    assert len(axes) == 4
    for ax in axes:
        assert ax.get_xscale() == "log" and "nats/token" in ax.get_ylabel()
    assert "Baseline" in axes[0].get_ylabel() and "SMELT" in axes[2].get_ylabel()
    for ax, arch in ((axes[0], "baseline"), (axes[2], "smelt")):
        assert ax.lines and all(hue_is(line.get_color(), arch) for line in ax.lines)
    # the law lines go through the law: a line at N = xs evaluated at its own D grid
    line = axes[0].lines[0]
    np.testing.assert_allclose(line.get_ydata(), fits["baseline"].predict(N=SIZES["xs"], D=line.get_xdata()))


def test_fits_figure_bootstrap_band_holds_the_law_and_needs_samples(points, fits):
    """Around every law line drawn on a grid: the percentile band of the law under the fit's
    bootstrap parameter samples, computed here by hand; it holds the point-estimate line (a good
    fit of 0.2% noise), and a fit without samples gets no band."""
    import dataclasses


    fig = plots.fits(points, fits)
    axes = visible(fig)
    bands = [c for ax in axes for c in ax.collections if c.get_gid() == "bootstrap band"]
    laws = [ln for ax in axes for ln in ax.lines
            if ln.get_linestyle() == "-" and ln.get_marker() in ("None", "")]
    # left: one band per size, right: one per token level, per group
    n_lines = sum(len(set(points.loc[points["group"] == g, k])) for g in fits for k in ("N", "D"))
    assert len(bands) == n_lines and len(laws) == n_lines
    ax = axes[0]                                             # Baseline, loss against D at each N
    f = fits["baseline"]
    band, line = ax.collections[0], ax.lines[0]              # the smallest N: band first, then the law
    D = np.geomspace(min(points["D"]) / 1.6, max(points["D"]) * 1.6, 80)
    by_hand = np.array([CHIN.predict(dict(zip(CHIN.params, row)), N=SIZES["xs"], D=D)
                        for row in f.bootstrap])
    lo, hi = np.quantile(by_hand, [0.025, 0.975], axis=0)
    verts = {(round(float(x), 6), round(float(v), 9)) for x, v in band.get_paths()[0].vertices}
    for edge in (lo, hi):                                    # both edges of the polygon are the hand band
        assert {(round(float(x), 6), round(float(v), 9)) for x, v in zip(D, edge)} <= verts
    y = f.predict(N=SIZES["xs"], D=D)
    np.testing.assert_allclose(line.get_ydata(), f.predict(N=SIZES["xs"], D=line.get_xdata()))
    assert np.all(lo <= y) and np.all(y <= hi) and np.all(hi - lo > 0)
    assert "bootstrap" in fig._suptitle.get_text()
    none = {g: dataclasses.replace(r, bootstrap=np.zeros((0, r.bootstrap.shape[1]))) for g, r in fits.items()}
    fig = plots.fits(points, none)
    assert not [c for ax in visible(fig) for c in ax.collections if c.get_gid() == "bootstrap band"]
    assert "bootstrap" not in fig._suptitle.get_text()


def test_residuals_are_log_residuals(points, fits):
    fig = plots.residuals(points, fits)
    ax = visible(fig)[0]
    sub = points[points["group"] == "baseline"]
    expected = np.log(sub["loss"]) - np.log(fits["baseline"].predict(N=sub["N"], D=sub["D"]))
    got = np.concatenate([line.get_ydata() for line in ax.lines if len(line.get_xdata()) > 2])
    np.testing.assert_allclose(np.sort(got), np.sort(expected), rtol=1e-9, atol=1e-12)
    assert np.abs(got).max() < 0.02       # 0.2% noise: the fit is good


def test_params_panels_log_scales_and_intervals(fits):
    fig = plots.params(fits)
    axes = {ax.get_title(): ax for ax in visible(fig)}
    assert len(axes) == 8            # E, A, alpha, B, beta, a, b, frontier exponent
    assert axes["$A$"].get_yscale() == "log" and axes["$B$"].get_yscale() == "log"
    assert axes[r"$\alpha$"].get_yscale() == "linear"
    est = [line.get_ydata()[0] for line in axes[r"$\alpha$"].lines if line.get_marker() in ("o", "s")
           and len(line.get_ydata()) == 1]
    assert est == pytest.approx([fits["baseline"].params["alpha"], fits["smelt"].params["alpha"]])


def test_isoflop_slices_interpolate_inside_each_run(points):
    sl = isoflop_slices(points, levels=[2e12, 1e20])
    assert not np.isclose(sl["compute"], 1e20).any()          # no extrapolation
    run = sl[sl["run"] == "proxy-m-baseline-s0"].iloc[0]
    p = points[points["run"] == "proxy-m-baseline-s0"].sort_values("flops")
    expected = np.exp(np.interp(np.log(2e12), np.log(p["flops"]), np.log(p["loss"])))
    assert run["loss"] == pytest.approx(expected)
    auto = isoflop_slices(points, n_levels=3)
    assert auto["compute"].nunique() == 3
    assert (auto.groupby(["group", "compute"]).size() == len(SIZES)).all()   # every size covers them


def test_isoflop_figure(points, fits):
    fig = plots.isoflop(isoflop_slices(points), points, fits)
    axes = visible(fig)
    assert len(axes) == 3
    assert axes[-1].get_xscale() == "log" and axes[-1].get_yscale() == "log"
    assert "N*" in axes[-1].get_ylabel() and "FLOPs" in axes[-1].get_xlabel()


def test_frontier_draws_the_closed_form(points, fits):
    fig = plots.frontier(fits, points)
    ax = visible(fig)[0]
    line = next(l for l in ax.lines if l.get_label() == "Baseline: L*(C)")
    law = FittedLaw.from_fit(fits["baseline"])
    expected = law_frontier(law.law, law.theta, line.get_xdata(), cost=law.cost).loss
    np.testing.assert_allclose(line.get_ydata(), expected)
    assert ax.get_xscale() == "log" and "FLOPs" in ax.get_xlabel()
    assert any("extrapolation" in t.get_text() for t in ax.texts)


def test_savings_figure_matches_the_result(fits):
    ref, cand = FittedLaw.from_fit(fits["baseline"]), FittedLaw.from_fit(fits["smelt"])
    budgets = np.logspace(12, 21, 10)
    res, skipped = savings_over(ref, cand, budgets)
    assert not skipped and len(res.rows) == 10
    fig = plots.savings(res, data_range=(ref.compute_min, ref.compute_max), mark=1e21)
    ax = visible(fig)[0]
    line = next(l for l in ax.lines if l.get_label().startswith("SMELT vs Baseline"))
    np.testing.assert_allclose(line.get_ydata(), [100 * r.savings for r in res.rows])
    assert len(ax.collections) >= 1                          # the bootstrap band
    assert any("at 1e+21" in t.get_text() for t in ax.texts)
    assert all(r.savings > 0 for r in res.rows)              # SMELT has the smaller A


def test_savings_band_is_clipped_at_the_axis_with_triangles_and_one_percent_format(fits):
    """An interval far past the axis (as far from the data: -1e5 %) is cut at the axis, a triangle at
    the edge says it goes on, and the note writes every percentage as format.percent does."""
    import dataclasses

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from scaling.common.format import percent

    ref, cand = FittedLaw.from_fit(fits["baseline"]), FittedLaw.from_fit(fits["smelt"])
    res, _ = savings_over(ref, cand, np.logspace(12, 21, 10))
    wide = {3: (-1000.0, 0.5), 9: (res.rows[9].savings - 0.01, 40.0)}     # fractions: -100000 %, +4000 %
    rows = [dataclasses.replace(r, savings_ci=wide.get(i, (r.savings - 0.01, r.savings + 0.01)))
            for i, r in enumerate(res.rows)]
    res = dataclasses.replace(res, rows=tuple(rows) if isinstance(res.rows, tuple) else rows)
    fig = plots.savings(res, mark=1e21)
    FigureCanvasAgg(fig).draw()
    ax = visible(fig)[0]
    y0, y1 = ax.get_ylim()
    band = next(c for c in ax.collections if "bootstrap interval" in str(c.get_label()))
    ys = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert ys.min() >= y0 - 1e-9 and ys.max() <= y1 + 1e-9 and y0 > -1000 and y1 < 1000
    down = [ln for ln in ax.lines if ln.get_marker() == "v"]
    up = [ln for ln in ax.lines if ln.get_marker() == "^"]
    assert len(down) == 1 and np.allclose(down[0].get_xdata(), [rows[3].budget])
    assert len(up) == 1 and np.allclose(up[0].get_xdata(), [rows[9].budget])
    assert y0 < down[0].get_ydata()[0] < y0 + 0.05 * (y1 - y0)
    note = next(t.get_text() for t in ax.texts if t.get_text().startswith("at 1e+21"))
    r = rows[9]
    assert note.splitlines()[:2] == [f"at 1e+21 FLOPs: {percent(r.savings, 1)}",
                                     f"95% CI [{percent(r.savings - 0.01, 1)}, {percent(40.0, 1)}]"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "95% bootstrap interval" in legend and "interval continues beyond the axis" in legend


def test_savings_over_leaves_out_unanswerable_budgets(fits):
    ref, cand = FittedLaw.from_fit(fits["baseline"]), FittedLaw.from_fit(fits["smelt"])
    with pytest.raises(UserError):
        savings_over(ref, cand, [-1.0])


def test_save_formats(points, fits, tmp_path):
    fig = plots.params(fits)
    for suffix in ("png", "pdf"):
        path = plots.save(fig, tmp_path / f"f.{suffix}")
        assert path.stat().st_size > 1000
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(UserError, match=".png, .pdf or .svg"):
        plots.save(fig, tmp_path / "f.jpg")


# -- mechanism figures ---------------------------------------------------------------------------
def sink_results():
    from scaling.analysis import PassMass, SinkResult

    base = SinkResult("b", "baseline", "bos", 4, 100, 0,
                      tuple(PassMass(i, 1, 0.5 - 0.05 * i, 0.5 + 0.05 * i) for i in range(4)))
    passes = [PassMass(0, 1, 0.6, 0.4), PassMass(1, 1, 0.6, 0.4), PassMass(2, 1, 0.5, 0.5),
              PassMass(1, 2, 0.05, 0.95), PassMass(2, 2, 0.02, 0.98), PassMass(3, 1, 0.3, 0.7)]
    return [SinkResult("s", "smelt", "bos", 4, 100, 0, tuple(passes)), base]


def test_sink_bars_are_the_masses():
    res = sink_results()
    fig = plots.sink(res)
    axes = visible(fig)
    assert [a.get_title().split("\n")[0] for a in axes] == ["b", "s"]       # Baseline first
    bos = [p.get_height() for p in axes[1].patches[:6]]
    assert bos == pytest.approx([0.6, 0.6, 0.5, 0.05, 0.02, 0.3])
    labels = [t.get_text() for t in axes[1].get_xticklabels()]
    assert labels == ["L0", "L1·1", "L2·1", "L1·2", "L2·2", "L3"]
    assert axes[0].get_ylim() == pytest.approx((0.0, 0.75))     # zoomed to 1.25 x the largest mass


def test_sink_dyck_probe_stacks_answers():
    from scaling.analysis import PassMass, SinkResult

    passes = (PassMass(0, 1, 0.6, 0.16, 0.24), PassMass(0, 2, 0.02, 0.13, 0.85))
    ax = visible(plots.sink([SinkResult("s", "smelt", "dyck", 4, 40, 0, passes, shots=4)]))[0]
    bars = [p for p in ax.patches if p.get_width() == pytest.approx(0.38)]   # not the loop's shading
    heights = [p.get_height() for p in bars]
    assert heights == pytest.approx([0.6, 0.02, 0.24, 0.85])               # BOS, then answers
    assert bars[2].get_x() > bars[0].get_x()                               # answers beside BOS
    assert "demonstration answers" in [t.get_text() for t in ax.get_legend().get_texts()]


def lengths_results():
    from scaling.analysis import LengthsResult, LossBucket, length_gain

    def run(name, arch, shift):
        bs = []
        for by, edges in (("length", [1, 16, 32, 257]), ("position", [0, 64, 128, 256])):
            for lo, hi in zip(edges[:-1], edges[1:]):
                seq = tuple(4.0 + 0.001 * lo + shift + 0.01 * i for i in range(3))
                bs.append(LossBucket(by, lo, hi, 3, 30, float(np.mean(seq)), seq, (10, 10, 10)))
        return LengthsResult(name, arch, 256, 3, 3, tuple(bs))

    b, s = run("b", "baseline", 0.0), run("s", "smelt", -0.05)
    return [s, b], length_gain(b, s)


def test_lengths_with_gain():
    res, gain = lengths_results()
    fig = plots.lengths(res, gain)
    axes = visible(fig)
    assert len(axes) == 4
    gain_line = axes[2].lines[0]
    np.testing.assert_allclose(gain_line.get_ydata(), [0.05, 0.05, 0.05], atol=1e-12)
    assert "nats/token" in axes[0].get_ylabel()
    assert len(visible(plots.lengths(res))) == 2


def test_icl_accuracy_and_intervals():
    from scaling.analysis import ICLResult, ShotAccuracy, wilson_interval

    def run(name, arch, correct):
        shots = tuple(ShotAccuracy(k, 50, c, c / 50, *wilson_interval(c, 50), 10.0 * (k + 1))
                      for k, c in zip((0, 1, 2, 4), correct))
        return ICLResult(name, arch, 256, {"n_types": 3, "min_pairs": 2, "max_pairs": 8}, 50, 0, 0.95, shots)

    fig = plots.icl([run("s", "smelt", [1, 5, 9, 12]), run("b", "baseline", [0, 4, 6, 10])])
    ax = visible(fig)[0]
    assert ax.get_xscale() == "symlog"
    ys = [line.get_ydata() for line in ax.lines if len(line.get_ydata()) == 4]
    np.testing.assert_allclose(ys[0], [0, 8, 12, 20])        # Baseline first, in %
    assert hue_is(ax.lines[0].get_color(), "baseline")


# -- CLI ---------------------------------------------------------------------------------------
def one_line_error(res, pattern):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], res.stderr


def test_cli_all_writes_figures_and_skips_missing_analyses(runs, tmp_path):
    out = tmp_path / "figs"
    res = runner.invoke(app, ["plot", "all", "--out", str(out), "--runs", str(runs), "--bootstrap", "4",
                              "--budgets", "1e12:1e21:4", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert set(data) == {"schema", "figures", "skipped"} and data["schema"] == "smelt-scale.plot/1"
    kinds = {f["kind"] for f in data["figures"]}
    assert kinds == {"loss-curves", "fits", "isoflop", "residuals", "params", "frontier", "savings"}
    assert {s["kind"] for s in data["skipped"]} == {"sink", "lengths", "icl"}
    for f in data["figures"]:
        assert Path(f["path"]).stat().st_size > 1000 and f["path"].endswith(".png")


def test_cli_mechanism_kinds(runs, tmp_path):
    one_line_error(runner.invoke(app, ["plot", "icl", "--out", str(tmp_path), "--runs", str(runs)]),
                   "no saved icl analysis")
    from scaling.analysis import save_result

    copy = write_runs(tmp_path / "r")
    for r in sink_results():
        run = copy / ("proxy-s-baseline-s0" if r.arch == "baseline" else "proxy-s-smelt-s0")
        (run / "final_weights.safetensors").write_bytes(r.arch.encode())
        sha = hashlib.sha256(r.arch.encode()).hexdigest()
        save_result(r, run, weights=[{"run": run.name, "file": "final_weights.safetensors", "sha256": sha}])
    res = runner.invoke(app, ["plot", "sink", "--out", str(tmp_path / "o"), "--runs", str(copy), "--format",
                              "pdf", "--json"])
    assert res.exit_code == 0, res.output
    assert [Path(f["path"]).name for f in json.loads(res.stdout)["figures"]] == ["sink.pdf"]
    assert "present weights" not in res.stderr
    # the smelt run trained on after its analysis: the figure is still drawn, with a warning
    (copy / "proxy-s-smelt-s0" / "final_weights.safetensors").write_bytes(b"extended")
    res = runner.invoke(app, ["plot", "sink", "--out", str(tmp_path / "o2"), "--runs", str(copy), "--json"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.stderr.split())
    assert "saved sink analysis of proxy-s-smelt-s0 is not of its present weights" in said
    assert "proxy-s-baseline-s0 is not" not in res.stderr


@pytest.mark.parametrize("args, pattern", [
    (["plot", "bogus"], "'bogus' is not one of"),
    (["plot", "fits", "--format", "jpg"], "'jpg' is not one of 'png', 'pdf', 'svg'"),
    (["plot", "fits", "--budgets", "1e20:x"], "--budgets"),
    (["plot", "fits", "--runs", "/nonexistent/runs"], "no such runs folder"),
    # its help said "runs folder or table"; a table was refused as a missing folder
    (["plot", "fits", "--runs", str(Path(__file__))], "plot reads a runs folder, and"),
])
def test_cli_bad_input(args, pattern, tmp_path):
    one_line_error(runner.invoke(app, [*args, "--out", str(tmp_path)]), pattern)


def test_loss_curves_say_how_many_torn_lines_they_left_out(tmp_path):
    """Issue 19: readers never silently draw fewer lines than the log holds."""
    import shutil

    src = Path(__file__).resolve().parents[1] / "runs-cpu-proxy-2026-12-02" / "proxy-xxs-baseline-s0"
    shutil.copytree(src, tmp_path / "runs" / src.name)
    with open(tmp_path / "runs" / src.name / "metrics.jsonl", "a") as fh:
        fh.write('{"iter": 99, "trai')
    res = runner.invoke(app, ["plot", "loss-curves", "--runs", str(tmp_path / "runs"), "--out",
                              str(tmp_path / "fig")])
    assert res.exit_code == 0, res.output
    assert "1 torn last line of metrics.jsonl left out" in res.stderr


def test_a_failed_figure_write_keeps_the_previous_figure_whole(tmp_path, monkeypatch):
    """save() writes a tmp file and replaces the figure at the end: a write that fails part-way (here
    the PNG writer raises after its first bytes) leaves the previous figure as it was, no tmp file."""
    import matplotlib.pyplot as plt

    from scaling.plots.style import save

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    path = save(fig, tmp_path / "f.png")
    before = path.read_bytes()
    real = type(fig).savefig

    def torn(self, fh, **kw):
        fh.write(b"\x89PNG partial")
        raise OSError(27, "File too large")

    monkeypatch.setattr(type(fig), "savefig", torn)
    with pytest.raises(UserError, match="cannot write the figure"):
        save(fig, path)
    monkeypatch.setattr(type(fig), "savefig", real)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]
    plt.close(fig)

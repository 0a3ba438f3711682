"""`smelt-scale compare`: the README's paired numbers on the shipped runs, the clustered s.e., the sign
test, per-source and length-bucket breakdowns, the figure and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom
from typer.testing import CliRunner

from cli import app
from scaling.common.errors import UserError
from scaling.fitting.compare import (
    at_least_tokens,
    cluster_se,
    compare,
    length_buckets,
    pair_stats,
    with_validation_ids,
)
from scaling.fitting.tables import read_runs_dir

RUNS = Path(__file__).resolve().parents[1] / "runs"
FIRST = Path(__file__).resolve().parents[1] / "runs-cpu-proxy-2026-12-02"   # the first sweep
runner = CliRunner()


@pytest.fixture(scope="module")
def shipped() -> pd.DataFrame:
    return read_runs_dir(RUNS)


def test_shipped_runs_reproduce_the_readme(shipped):
    res = compare(with_validation_ids(RUNS, shipped))
    o = res.overall
    # README: "-0.084 ± 0.022 nats (mean ± cluster-robust s.e., 213 pairs in 59 run-pair clusters)"
    assert (o.n_pairs, o.n_clusters) == (213, 59)
    assert round(o.mean, 3) == -0.084 and round(o.se, 3) == 0.022 and round(o.se_iid, 3) == 0.013
    assert (round(o.ci_lo, 3), round(o.ci_hi, 3), o.df) == (-0.127, -0.041, 58)
    assert (res.n_cells_candidate_better, len(res.cells), o.n_candidate_better) == (28, 35, 156)
    assert round(res.seed_spread, 3) == 0.254 and round(res.seed_sd, 3) == 0.125 and res.n_seeds == 7
    assert not res.dropped
    # the IsoFLOP budgets, grouped by their compute (not by budget index: the larger sizes start
    # at a later budget); five seeds or more in every cell
    assert [(b.label, b.n_pairs, round(b.mean, 3), round(b.se, 3)) for b in res.by_budget] == [
        ("C 3.56e+11 FLOPs", 40, -0.100, 0.039), ("C 6.32e+11 FLOPs", 54, -0.136, 0.032),
        ("C 1.12e+12 FLOPs", 59, -0.072, 0.021), ("C 2e+12 FLOPs", 35, -0.030, 0.019),
        ("C 3.56e+12 FLOPs", 25, -0.049, 0.014)]
    late = compare(at_least_tokens(shipped, 3e5)).overall   # "-0.056 ± 0.018 at 0.3M tokens and above"
    assert late.n_pairs == 140 and round(late.mean, 3) == -0.056 and round(late.se, 3) == 0.018
    assert any("no per-source loss" in n for n in res.notes) and not res.by_source


def test_shipped_runs_have_the_readmes_seeds(shipped):
    # runs/README.md: seeds 0-4 of every size to its last budget, seeds 5-6 of d_model 6-56 (and 3-4
    # of d_model 6) to the middle budget (1.12e12 FLOPs): 118 runs, 426 points, every (size, budget)
    # cell 5 or 7 seeds
    budgets = np.array([3.56e11, 6.32e11, 1.12e12, 2e12, 3.56e12])
    at = budgets[np.abs(np.log(shipped["flops"].to_numpy()[:, None] / budgets)).argmin(axis=1)]
    assert shipped["run"].nunique() == 118 and len(shipped) == 426
    seeds = shipped.assign(budget=at).groupby(["tier", "arch", "budget"])["seed"].agg(set)
    for (tier, _, budget), got in seeds.items():
        d = int(tier.removeprefix("iso-d"))
        want = set(range(7)) if 6 <= d <= 56 and budget <= 1.12e12 else set(range(5))
        assert got == want, (tier, budget)
    assert len(seeds) == 2 * 35


def test_the_first_sweep_groups_its_budgets_by_tokens():
    res = compare(read_runs_dir(FIRST))
    assert res.overall.n_pairs == 48 and round(res.overall.mean, 3) == 0.074
    assert [b.label for b in res.by_budget] == ["0.127M tokens", "0.25M tokens", "0.5M tokens",
                                                "0.999M tokens", "2M tokens"]


def test_seed_noise_planted():
    """seed_spread = mean max - min over cells with >= 2 seeds; seed_sd = the pooled within-cell s.d.
    (ddof 1), on a table with planted losses: cell A seeds 5.0/5.2/5.4 (range 0.4, var 0.04), cell B
    6.0/6.1 (range 0.1, var 0.005), a one-seed cell left out."""
    from scaling.fitting.compare import seed_spread

    rows = [("t1", "baseline", 0, s, v) for s, v in enumerate((5.0, 5.2, 5.4))]
    rows += [("t1", "smelt", 0, s, v) for s, v in enumerate((6.0, 6.1))] + [("t2", "smelt", 0, 0, 9.0)]
    pts = pd.DataFrame(rows, columns=["tier", "arch", "budget_index", "seed", "loss"])
    spread, n_seeds, sd = seed_spread(pts, ("baseline", "smelt"))
    assert spread == pytest.approx(0.25) and n_seeds == 3
    assert sd == pytest.approx(math.sqrt((2 * 0.04 + 1 * 0.005) / 3))
    # a non-finite loss (the loaders refuse one; a direct caller may not) leaves its cell out
    bad = pd.concat([pts, pd.DataFrame([("t3", "smelt", 0, 0, 5.0), ("t3", "smelt", 0, 1, math.inf)],
                                       columns=pts.columns)])
    assert seed_spread(bad, ("baseline", "smelt")) == (spread, n_seeds, sd)


def test_cluster_se_matches_the_textbook_special_cases():
    rng = np.random.default_rng(0)
    d = rng.standard_normal(12)
    # one pair per cluster: the plain s.e.
    assert cluster_se(d, np.arange(12)) == pytest.approx(d.std(ddof=1) / math.sqrt(12))
    # equal cluster sizes: the s.e. of the mean over cluster means
    g = np.repeat(np.arange(4), 3)
    means = np.array([d[g == k].mean() for k in range(4)])
    assert cluster_se(d, g) == pytest.approx(means.std(ddof=1) / 2.0)
    assert cluster_se(d, np.zeros(12)) is None


def test_sign_test_is_the_exact_binomial():
    pairs = pd.DataFrame({"tier": "t", "seed": np.arange(10), "budget_index": 0,
                          "diff": [-1, -2, -3, -1, -1, -1, -1, -1, 2, 0.0]})
    s = pair_stats(pairs, "x", "none")
    assert s.n_candidate_better == 8
    # 8 of 9 non-tied pairs below zero: two-sided p = 2 P(X >= 8), X ~ Bin(9, 1/2)
    assert s.sign_p == pytest.approx(2 * binom.sf(7, 9, 0.5))


def _points(sources: bool) -> pd.DataFrame:
    rows = []
    for tier in ("a", "b"):
        for seed in (0, 1, 2):
            for b, D in enumerate((1e5, 2e5)):
                for arch, shift in (("baseline", 0.0), ("smelt", -0.1)):
                    p = {"run": f"{tier}-{arch}-s{seed}", "arch": arch, "tier": tier, "seed": seed,
                         "budget_index": b, "D": D, "N": 1e5, "loss": 4.0 + shift + 0.01 * seed}
                    if sources:
                        p["val_loss/code"] = 3.0 + 2 * shift
                        p["val_loss/prose"] = 5.0
                    rows.append(p)
    return pd.DataFrame(rows)


def test_per_source_breakdown_when_the_runs_log_it():
    res = compare(_points(True))
    assert res.overall.mean == pytest.approx(-0.1)
    assert res.by_source["code"].mean == pytest.approx(-0.2)
    assert res.by_source["prose"].mean == pytest.approx(0.0)
    assert res.by_source["code"].n_pairs == 12
    d = res.to_dict()
    assert set(d["by_source"]) == {"code", "prose"} and d["overall"]["n_pairs"] == 12


def test_duplicate_and_missing_pairs_are_errors():
    pts = _points(False)
    with pytest.raises(UserError, match="share tier"):
        compare(pd.concat([pts, pts.iloc[:1]]))
    # two runs of one tier and seed at two peak lrs (an lr sweep in one tier): the message says so
    twice = pd.concat([pts.assign(lr=1e-3), pts.iloc[:1].assign(lr=2e-3)])
    with pytest.raises(UserError, match=r"they trained at peak lrs 0\.001, 0\.002: an lr sweep pairs"):
        compare(twice)
    with pytest.raises(UserError, match="no runs of architecture 'dense'"):
        compare(pts, candidate="dense")
    with pytest.raises(UserError, match="budget_index"):
        compare(pts.drop(columns="budget_index"))


def test_length_buckets_of_the_shipped_pair():
    first = read_runs_dir(FIRST)
    buckets = length_buckets(FIRST, first, "baseline", "smelt")
    assert {(b["tier"], b["seed"]) for b in buckets} == {("proxy-s", "0")}
    gain = json.loads((FIRST / "proxy-s-smelt-s0" / "analysis" / "lengths_gain.json").read_text())["result"]
    by = {(b["by"], b["lo"]): b for b in gain["buckets"] if b["gain"] is not None}
    for b in buckets:   # the analysis's gain is baseline - smelt
        assert b["diff"] == pytest.approx(-by[(b["by"], b["lo"])]["gain"], abs=1e-12)


def test_cli_json_table_and_figure(tmp_path):
    res = runner.invoke(app, ["compare", str(RUNS), "--json"])
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    assert set(d["overall"]) >= {"mean", "se", "n_pairs"} and d["overall"]["n_pairs"] == 213
    assert d["cluster"] == "run" and len(d["by_tier"]) == 9 and len(d["cells"]) == 35 and d["dropped"] == []
    out = tmp_path / "cmp.png"
    res = runner.invoke(app, ["compare", str(RUNS), "--plot", str(out), "--cells"])
    assert res.exit_code == 0, res.stderr
    assert out.stat().st_size > 10_000 and "28 of 35" in res.stdout
    seed = json.loads(runner.invoke(app, ["compare", str(RUNS), "--cluster", "seed", "--json"]).stdout)
    assert seed["overall"]["n_clusters"] == 7


# -- pairing on the actual budget and validation data (issue 26) -----------------------------------
def _two_runs(tier: str, seed: int, d_ref: tuple[float, ...], d_cand: tuple[float, ...],
              val: tuple[str, str] = ("v", "v")) -> pd.DataFrame:
    rows = []
    for arch, Ds, v in (("baseline", d_ref, val[0]), ("smelt", d_cand, val[1])):
        for b, D in enumerate(Ds):
            rows.append({"run": f"{tier}-{arch}-s{seed}", "arch": arch, "tier": tier, "seed": seed,
                         "budget_index": b, "D": D, "flops": 3e6 * D, "N": 1e5, "val_set": v,
                         "loss": 4.0 + (0.5 if arch == "smelt" else 0.0)})
    return pd.DataFrame(rows)


def test_pairs_need_the_same_tokens_not_the_same_budget_index():
    # the case: Baseline at 127k/250k tokens, SMELT at 20k/41k, same tier and seed
    bad = _two_runs("t", 0, (126_976, 249_856), (20_480, 40_960))
    with pytest.raises(UserError, match="no \\(tier, budget, seed\\) has both.*same tokens"):
        compare(bad)
    # beside a matched tier the mismatched one is dropped and named, not paired
    good = _two_runs("u", 0, (126_976, 249_856), (126_976, 249_856))
    res = compare(pd.concat([good, bad], ignore_index=True))
    assert res.overall.n_pairs == 2 and set(res.pairs["tier"]) == {"u"}
    assert len(res.dropped) == 4 and {d["tier"] for d in res.dropped} == {"t"}
    assert any("4 unpaired" in n and "20,480 tokens" in n for n in res.notes)
    # budgets listed in another order still pair by tokens, within whole-batch rounding (1%)
    shifted = _two_runs("w", 0, (1e5, 2e5), (2e5 * 1.004, 5e4, 1e5 * 0.996))
    res = compare(shifted)
    assert res.overall.n_pairs == 2 and len(res.dropped) == 1 and res.dropped[0]["D"] == 5e4


def test_pairs_need_the_same_validation_data_and_matched_flops():
    pts = pd.concat([_two_runs("a", 0, (1e5, 2e5), (1e5, 2e5)),
                     _two_runs("b", 0, (1e5, 2e5), (1e5, 2e5), val=("v", "other"))], ignore_index=True)
    res = compare(pts)
    assert set(res.pairs["tier"]) == {"a"}
    assert {d["tier"] for d in res.dropped} == {"b"}
    assert all("validation data" in d["reason"] for d in res.dropped)
    off = _two_runs("c", 0, (1e5,), (1e5,))
    off.loc[off["arch"] == "smelt", "flops"] *= 1.05
    with pytest.raises(UserError, match="not compute-matched"):
        compare(off)


def test_cli_refuses_runs_at_other_budgets_and_names_them(tmp_path):
    import shutil
    for arch in ("baseline", "smelt"):
        shutil.copytree(FIRST / f"proxy-xs-{arch}-s0", tmp_path / f"proxy-xs-{arch}-s0",
                        ignore=shutil.ignore_patterns("*.safetensors", "eval_data", "analysis"))
    final = tmp_path / "proxy-xs-smelt-s0" / "final.json"
    doc = json.loads(final.read_text())
    for p in doc["points"]:       # another run of the same tier, trained 6x shorter
        p["D"] = p["D"] // 6
        p["flops"] = p["flops"] // 6
    final.write_text(json.dumps(doc))
    res = runner.invoke(app, ["compare", str(tmp_path)])
    assert res.exit_code == 2 and "same tokens" in res.stderr and "Traceback" not in res.stderr
    cfg = tmp_path / "proxy-xs-smelt-s0" / "config.json"
    shutil.copy(FIRST / "proxy-xs-smelt-s0" / "final.json", final)
    c = json.loads(cfg.read_text())
    c["resolved"]["val_windows"] = 100   # evaluated on fewer held-out windows
    cfg.write_text(json.dumps(c))
    res = runner.invoke(app, ["compare", str(tmp_path)])
    assert res.exit_code == 2 and "validation data" in res.stderr


def test_a_diverged_or_corrupt_loss_is_named_never_a_traceback_or_silent(tmp_path):
    """A NaN loss (a diverged budget) leaves out that point with a warning naming it; a loss that
    is not a number makes its run unreadable (named); the rest still compare."""
    import shutil
    for arch in ("baseline", "smelt"):
        shutil.copytree(FIRST / f"proxy-xs-{arch}-s0", tmp_path / f"proxy-xs-{arch}-s0",
                        ignore=shutil.ignore_patterns("*.safetensors", "eval_data", "analysis"))
    final = tmp_path / "proxy-xs-smelt-s0" / "final.json"
    doc = json.loads(final.read_text())
    n = len(doc["points"])
    doc["points"][0]["loss"] = float("nan")
    final.write_text(json.dumps(doc))
    res = runner.invoke(app, ["compare", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.stderr
    assert "loss nan is not finite" in res.stderr and f"D={doc['points'][0]['D']}" in res.stderr
    assert json.loads(res.stdout)["overall"]["n_pairs"] == n - 1
    for bad, why in ((None, "no loss"), (0, "loss 0 is not positive"), (-1.5, "loss -1.5 is not positive")):
        doc["points"][0]["loss"] = bad
        final.write_text(json.dumps(doc))
        res = runner.invoke(app, ["compare", str(tmp_path), "--json"])
        assert res.exit_code == 0 and why in res.stderr, res.stderr
        assert json.loads(res.stdout)["overall"]["n_pairs"] == n - 1
    doc["points"][0]["loss"] = 10 ** 400
    final.write_text(json.dumps(doc))
    res = runner.invoke(app, ["compare", str(tmp_path)])
    assert res.exit_code == 2 and "beyond any float" in res.stderr and "Traceback" not in res.stderr
    doc["points"][0]["loss"] = "abc"
    final.write_text(json.dumps(doc))
    res = runner.invoke(app, ["compare", str(tmp_path)])
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "proxy-xs-smelt-s0: unreadable final.json (loss 'abc' is not a number)" in res.stderr


def test_row_filter_compares_one_lr_of_a_sweep_in_one_tier():
    """An lr sweep whose lrs share a tier cannot pair (two runs per tier and seed); the error says
    which row filter picks one lr, and with it each lr gives its own planted difference: -0.1 nats
    at lr 1e-3, +0.05 at lr 2e-3 (plus seed noise common to both twins, which the pairing removes).
    The seed spread is of the kept points only."""
    pts = _points(False)
    a = pts.assign(lr=1e-3)
    shift = np.where(pts["arch"] == "smelt", 0.15, 0.0)
    b = pts.assign(lr=2e-3, loss=pts["loss"] + shift + 0.3 * pts["seed"])
    both = pd.concat([a, b], ignore_index=True)
    with pytest.raises(UserError, match=r"with the row filter 'lr == 0\.001'"):
        compare(both)
    at_a, at_b = compare(both, where=["lr == 0.001"]), compare(both, where=["lr == 0.002"])
    assert at_a.overall.mean == pytest.approx(-0.1) and at_a.overall.n_pairs == 12
    assert at_b.overall.mean == pytest.approx(0.05) and at_b.overall.n_pairs == 12
    assert at_a.seed_spread == pytest.approx(0.02) and at_b.seed_spread == pytest.approx(0.62)
    assert (at_a.where, at_a.n_points, at_a.n_points_kept) == (("lr == 0.001",), 48, 24)
    # filters combine (all must hold); one that keeps nothing, or runs code, is a UserError
    three = ["lr == 0.002", "seed >= 1", "tier in ['a']"]
    one = compare(both, where=three)
    assert one.overall.n_pairs == 4 and one.to_dict()["where"] == three
    with pytest.raises(UserError, match="no point of the 48"):
        compare(both, where=["lr > 1"])
    with pytest.raises(UserError, match="calls"):
        compare(both, where=["loss.to_csv('x') != 1"])


def test_cli_where_on_the_shipped_runs(tmp_path):
    """``compare runs/ --where 'seed >= 3'`` is the seven-seed cells' extra seeds alone, the same
    pairs as selecting them by hand; a filter that runs code is one line and exit 2, writing nothing."""
    res = runner.invoke(app, ["compare", str(RUNS), "--where", "seed >= 3", "--json"])
    assert res.exit_code == 0, res.stderr
    d = json.loads(res.stdout)
    pts = read_runs_dir(RUNS)
    by_hand = compare(pts[pts["seed"] >= 3])
    assert d["overall"]["mean"] == pytest.approx(by_hand.overall.mean, abs=1e-12)
    assert d["overall"]["n_pairs"] == by_hand.overall.n_pairs
    assert d["n_points_kept"] == (pts["seed"] >= 3).sum() and d["n_points"] == len(pts)
    out = tmp_path / "f.png"
    bad = "__import__('os').remove('x')"
    res = runner.invoke(app, ["compare", str(RUNS), "--where", bad, "--plot", str(out)])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and not out.exists()


def test_where_keeps_the_length_buckets_of_the_kept_runs(tmp_path):
    """An lr sweep in one tier with analysis/lengths.json: each lr's buckets are its own pair's
    (the 2e-3 SMELT run's bucket losses planted 5 nats higher), and without a filter, where two
    runs of one architecture share the tier and seed, the buckets are left out with a note."""
    import shutil

    for tag, lr, bump in (("a", 1e-3, 0.0), ("b", 2e-3, 5.0)):
        for arch in ("baseline", "smelt"):
            dst = tmp_path / f"proxy-s-{arch}-s0-lr{tag}"
            shutil.copytree(FIRST / f"proxy-s-{arch}-s0", dst, ignore=shutil.ignore_patterns("eval_data"))
            cfg = json.loads((dst / "config.json").read_text())
            cfg["train"]["lr"] = lr
            (dst / "config.json").write_text(json.dumps(cfg))
            if arch == "smelt" and bump:
                f = dst / "analysis" / "lengths.json"
                doc = json.loads(f.read_text())
                for b in doc["result"]["buckets"]:
                    b["loss"] = None if b.get("loss") is None else b["loss"] + bump
                    b["seq_loss"] = [x + bump for x in b.get("seq_loss") or []]
                f.write_text(json.dumps(doc))
    diffs = {}
    for w in ("lr == 0.001", "lr == 0.002"):
        res = runner.invoke(app, ["compare", str(tmp_path), "--where", w, "--json"])
        assert res.exit_code == 0, res.stderr
        diffs[w] = np.array([b["diff"] for b in json.loads(res.stdout)["by_length"]])
    assert len(diffs["lr == 0.001"]) > 0
    np.testing.assert_allclose(diffs["lr == 0.002"] - diffs["lr == 0.001"], 5.0, atol=1e-9)
    points = read_runs_dir(tmp_path)
    notes: list[str] = []
    assert length_buckets(tmp_path, points, "baseline", "smelt", notes=notes) == []
    assert any("more than one run of an architecture" in n for n in notes)
